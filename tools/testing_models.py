"""Test helpers every environment's tests share (atom-core's, atom-vllm's and atom-sglang's support modules
re-export them): random checkpoints built locally (no model hub) and free localhost ports.

The repository root is on sys.path in every test environment (the root pyproject's pytest pythonpath), so
this module is importable there; it needs only torch and transformers, which every environment has.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch

# Tiny DeepSeek-V3 and V2 (MLA with a 32 + 16 latent row, DeepSeek's MoE after one dense layer): the
# attention and expert fields atom-core's parity tests and the adapters' engine tests share.
DEEPSEEK_V3_TINY = dict(
    intermediate_size=96,
    moe_intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=24,
    tie_word_embeddings=False,
)
DEEPSEEK_V2_TINY = dict(
    DEEPSEEK_V3_TINY,
    n_shared_experts=2,
    routed_scaling_factor=1.5,
    norm_topk_prob=False,
    q_lora_rank=None,
)
for _key in ("n_group", "topk_group"):  # V2-Lite routes greedily over all experts
    DEEPSEEK_V2_TINY.pop(_key)


def random_checkpoint(config, path: Path, *, seed: int = 0, max_shard_size=None, dtype=None):
    """transformers' model of `config` (any model config) with random weights drawn after
    torch.manual_seed(seed), saved to `path` (in shards of at most `max_shard_size` if given).
    Returns (the model in eval mode, path)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, **({} if dtype is None else {"dtype": dtype})).eval()
    model.save_pretrained(path, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
    return model, path


def free_port() -> int:
    """A localhost TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def successor_language(vocab: int, seed: int = 0):
    """A synthetic second-order language over ids 2.. (0 and 1 are BOS and EOS): token t after token u is
    followed by succ[u < vocab // 2][t] four times in five, else by a random token. A draft must know the
    token before the one it reads, which a chained MTP step only has through its own hidden state, so
    longer chains are accepted less often. Returns (succ [2, vocab], sample(batch, length, generator))."""
    gen = torch.Generator().manual_seed(seed)
    succ = torch.stack([torch.arange(2, vocab)[torch.randperm(vocab - 2, generator=gen)] for _ in range(2)])
    succ = torch.cat([torch.full((2, 2), 2), succ], dim=1)

    def sample(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
        rows = [torch.randint(2, vocab, (batch,), generator=generator) for _ in range(2)]
        for _ in range(length - 2):
            noise = torch.randint(2, vocab, (batch,), generator=generator)
            keep = torch.rand(batch, generator=generator) < 0.8
            follow = succ[(rows[-2] < vocab // 2).long(), rows[-1]]
            rows.append(torch.where(keep, follow, noise))
        return torch.stack(rows, 1)

    return succ, sample
