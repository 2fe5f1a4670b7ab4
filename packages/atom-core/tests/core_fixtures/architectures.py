"""Tiny model configs the tests build: the shared table (tools/testing_models.py) and atom-core's own variants."""

from tools.testing_models import DEEPSEEK_V2_TINY, DEEPSEEK_V3_TINY, TINY_ARCHITECTURES, TINY_DIMS

# A tiny Llama-shaped config (tools/testing_models.py's), the base the tests' own configs override (fp32 on
# the CPU in seconds).
TINY = dict(TINY_DIMS, **TINY_ARCHITECTURES["LlamaForCausalLM"], vocab_size=211)


# The model behind the tiny_llama fixture (engine, server and CLI tests).
TINY_LLAMA = dict(TINY, vocab_size=151)


# Qwen2-MoE's tiny MoE block: routed experts beside a sigmoid-gated shared expert
QWEN2_MOE_SHARED = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,
)


# Tiny DeepSeek-V3 and V2 (MLA + DeepSeek MoE): every path transformers implements is a variant of these.
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)


DSV3 = dict(
    DEEPSEEK_V3_TINY,
    vocab_size=211,
    hidden_size=64,
    num_hidden_layers=3,
    max_position_embeddings=256,
    rope_interleave=True,
    rope_parameters=dict(YARN, beta_fast=32, beta_slow=1, mscale=0.9, mscale_all_dim=0.7),
    bos_token_id=0,
    eos_token_id=1,
)


# Tiny GLM-4.5 (tools/testing_models.py's: partial rotary, q/k norms and biases beside DeepSeek's MoE) at
# DSV3's vocabulary and depth, for the MTP tests
GLM = dict(
    TINY_DIMS,
    **TINY_ARCHITECTURES["Glm4MoeForCausalLM"],
    vocab_size=211,
    num_hidden_layers=3,
    bos_token_id=0,
    eos_token_id=1,
)


DSV2 = dict(
    DEEPSEEK_V2_TINY,
    vocab_size=211,
    hidden_size=64,
    num_hidden_layers=3,
    max_position_embeddings=256,
    rope_parameters=dict(YARN, mscale=0.707, mscale_all_dim=0.707),
)


# Tiny GPT-OSS: alternating windows of 5 (shorter than the tests' prompts), YaRN without truncation, and a
# clamp low enough to bite, a SwiGLU alpha other than the published 1.702 (core_fixtures.checkpoints.
# gpt_oss_extras makes sinks, biases and experts large).
GPT_OSS_TINY = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=5,
    max_position_embeddings=256,
    swiglu_limit=0.6,
    swiglu_alpha=1.2,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=10000.0,
        factor=4.0,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
        original_max_position_embeddings=64,
    ),
    tie_word_embeddings=False,
)
