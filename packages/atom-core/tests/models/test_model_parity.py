"""ATOM models against HF transformers (the ground truth): real checkpoints saved by transformers, fp32 on the CPU.

For each architecture and config variant: a ragged batch of prompts prefilled together through the engine's
ModelRunner (paged KV cache, non-contiguous block tables) must give transformers' logits for every prompt token, and batched greedy decoding must give
transformers' greedy tokens for 32 steps.
"""

import pytest
import torch
from core_fixtures.architectures import QWEN2_MOE_SHARED, TINY
from core_fixtures.runner_driver import RunnerDriver
from transformers import LlamaConfig, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig

from tools.testing_models import random_checkpoint

BASE = dict(TINY, num_hidden_layers=3, num_attention_heads=8)
ROPE = dict(rope_theta=10000.0)
CASES = {
    "llama-gqa4": (LlamaConfig, {}),
    "llama-mha-tied-bias": (
        LlamaConfig,
        dict(num_key_value_heads=8, tie_word_embeddings=True, attention_bias=True),
    ),
    "llama-gqa8-headdim": (LlamaConfig, dict(num_key_value_heads=1, head_dim=16)),
    "llama3-rope": (
        LlamaConfig,
        dict(
            rope_scaling=dict(
                ROPE,
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            )
        ),
    ),
    "yarn-rope": (
        LlamaConfig,
        dict(rope_scaling=dict(ROPE, rope_type="yarn", factor=4.0, original_max_position_embeddings=32)),
    ),
    "yarn-mscale-untruncated": (
        LlamaConfig,
        dict(
            rope_scaling=dict(
                ROPE,
                rope_type="yarn",
                factor=4.0,
                mscale=0.8,
                mscale_all_dim=0.5,
                truncate=False,
                original_max_position_embeddings=32,
            )
        ),
    ),
    "yarn-attention-factor-betas": (
        LlamaConfig,
        dict(
            rope_scaling=dict(
                ROPE,
                rope_type="yarn",
                factor=3.0,
                attention_factor=1.3,
                beta_fast=16,
                beta_slow=2,
                original_max_position_embeddings=64,
            )
        ),
    ),
    "linear-rope": (LlamaConfig, dict(rope_scaling=dict(ROPE, rope_type="linear", factor=2.0))),
    "dynamic-rope-past-max": (
        LlamaConfig,
        dict(max_position_embeddings=24, rope_scaling=dict(ROPE, rope_type="dynamic", factor=2.0)),
    ),
    # transformers grows a dynamic base past max_position_embeddings, whatever original_max_position_embeddings says
    "dynamic-rope-original-ignored": (
        LlamaConfig,
        dict(
            max_position_embeddings=24,
            rope_scaling=dict(ROPE, rope_type="dynamic", factor=2.0, original_max_position_embeddings=12),
        ),
    ),
    "qwen3": (Qwen3Config, dict(head_dim=16)),
    # transformers' Qwen3 MLP has no biases whatever mlp_bias says (Llama's reads it)
    "qwen3-tied-mlp-bias-ignored": (
        Qwen3Config,
        dict(head_dim=16, tie_word_embeddings=True, num_key_value_heads=4, mlp_bias=True),
    ),
    "qwen3-moe": (
        Qwen3MoeConfig,
        dict(
            head_dim=16,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),
    ),
    "qwen3-moe-unnormed-step2": (
        Qwen3MoeConfig,
        dict(
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=3,
            moe_intermediate_size=24,
            norm_topk_prob=False,
            decoder_sparse_step=2,
        ),
    ),
    "qwen2-moe-shared-expert": (
        Qwen2MoeConfig,
        dict(QWEN2_MOE_SHARED, norm_topk_prob=False),
    ),
    "qwen2-moe-shared-normed-dense1": (
        Qwen2MoeConfig,
        dict(
            num_experts=6,
            num_experts_per_tok=3,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),
    ),
}


def save_hf_model(tmp_path, config_cls, overrides, shard=False):
    config = config_cls(**{**BASE, **overrides})
    return random_checkpoint(config, tmp_path / "ckpt", max_shard_size="40KB" if shard else None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_tokens_match_transformers(tmp_path, hf_greedy_tokens, case):
    config_cls, overrides = CASES[case]
    hf, path = save_hf_model(tmp_path, config_cls, overrides)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 211, (n,), generator=gen).tolist() for n in (13, 5, 21)]
    prefill, generated = RunnerDriver(path).greedy(prompts, steps=32)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        scale = ref.abs().max().item()
        torch.testing.assert_close(prefill[i], ref, rtol=0, atol=1e-4 * max(scale, 1.0))
        assert generated[i] == hf_greedy_tokens(hf, prompt, 32), (
            f"prompt {i} diverged from transformers' greedy tokens"
        )


def test_sharded_checkpoint(tmp_path):
    hf, path = save_hf_model(tmp_path, LlamaConfig, {}, shard=True)
    assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 1
    prompt = list(range(3, 19))
    prefill, _ = RunnerDriver(path).greedy([prompt], steps=1)
    with torch.no_grad():
        torch.testing.assert_close(prefill[0], hf(torch.tensor([prompt])).logits[0], rtol=0, atol=1e-4)


def test_triton_kernels_through_the_native_backend(tmp_path, hf_greedy_tokens):
    """The same parity with atom-kernels' Triton path (the interpreter on the CPU) doing cache writes and attention."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter is on only where no GPU is
    hf, path = save_hf_model(tmp_path, Qwen3Config, dict(head_dim=16, num_hidden_layers=2))
    prompts = [[5, 17, 42, 9, 100, 3, 77], [8, 8, 150]]
    prefill, generated = RunnerDriver(path, kernel_backend="triton", device=device).greedy(prompts, steps=6)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(prefill[i].cpu(), ref, rtol=0, atol=1e-4)
        assert generated[i] == hf_greedy_tokens(hf, prompt, 6)
