"""The published model shapes the engine benchmarks build with dummy weights."""

from __future__ import annotations

import transformers
from transformers import DeepseekV3Config, LlamaConfig, Qwen3MoeConfig

from tools.testing_mxfp4 import MXFP4  # gpt-oss's published quantization_config


def llama3_8b(layers: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        torch_dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )


def gpt_oss(layers: int, experts: int):
    """gpt-oss-20b (24 layers, 32 experts) and gpt-oss-120b (36, 128): the published shapes, MXFP4
    experts (the checkpoints' quantization_config), everything else bf16."""
    return transformers.GptOssConfig(
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=layers,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=experts,
        num_experts_per_tok=4,
        sliding_window=128,
        max_position_embeddings=131072,
        quantization_config=dict(MXFP4),
        architectures=["GptOssForCausalLM"],
        torch_dtype="bfloat16",
    )


def qwen3_30b_a3b() -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        architectures=["Qwen3MoeForCausalLM"],
        torch_dtype="bfloat16",
    )


def v2_lite_shape(layers: int) -> DeepseekV3Config:
    return DeepseekV3Config(
        vocab_size=102400,
        hidden_size=2048,
        intermediate_size=10944,
        moe_intermediate_size=1408,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=16,
        n_shared_experts=2,
        n_routed_experts=64,
        num_experts_per_tok=6,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.0,
        norm_topk_prob=False,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        max_position_embeddings=4096,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        num_nextn_predict_layers=1,
        architectures=["DeepseekV3ForCausalLM"],
        torch_dtype="bfloat16",
    )


LAYERS = 4


def v3_slice() -> DeepseekV3Config:
    return DeepseekV3Config(
        vocab_size=1024,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=LAYERS,
        num_attention_heads=128,
        num_key_value_heads=128,
        n_shared_experts=1,
        n_routed_experts=256,
        num_experts_per_tok=8,
        n_group=8,
        topk_group=4,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        max_position_embeddings=4096,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        architectures=["DeepseekV3ForCausalLM"],
        torch_dtype="bfloat16",
    )


SHAPES = {  # from the published configs (text_config for Qwen3.5)
    "qwen3.5-35b-a3b": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        dict(vocab_size=248320, num_hidden_layers=40, num_experts=256, num_experts_per_tok=8),
    ),
    "qwen3-next-80b-a3b": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        dict(
            vocab_size=151936,
            num_hidden_layers=48,
            num_experts=512,
            num_experts_per_tok=10,
            intermediate_size=5120,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        ),
    ),
}


COMMON = dict(
    hidden_size=2048,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    full_attention_interval=4,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def make_config(name: str, layers: int | None):
    class_name, arch, fields = SHAPES[name]
    fields = {**COMMON, **fields}
    if layers is not None:
        fields["num_hidden_layers"] = layers
    n = fields["num_hidden_layers"]
    fields["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    rope = dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25)
    if "Qwen3_5" in class_name:
        rope.update(mrope_section=[11, 11, 10], mrope_interleaved=True)
    config = getattr(transformers, class_name)(**fields, rope_parameters=rope, architectures=[arch])
    config.partial_rotary_factor = 0.25  # transformers keeps a top-level copy
    return config


def configs(name: str):
    if name == "llama3-8b":
        return llama3_8b(32), {}
    if name == "qwen3-30b-a3b":
        return qwen3_30b_a3b(), {}
    if name == "qwen3.5-35b-a3b":
        return make_config("qwen3.5-35b-a3b", None), {}
    if name == "deepseek-v2-lite-mtp2":
        return v2_lite_shape(27), {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}
    raise ValueError(name)


# The fp8 checkpoint format DeepSeek-V3 ships, for dummy fp8 builds of any shape (e4m3, 128x128 blocks)
FP8_FORMAT = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}
