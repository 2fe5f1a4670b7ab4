"""The bytes a decode step must read, from the engine's own model: the floor a step is measured against.

Weights: every parameter but the input embedding (a tied one is read whole as the head); a MoE block's
stacked experts (and their fp8 scales) in the share a step touches (their fp8 or MXFP4 scales and biases too): B sequences of k picks each reach
E(1 - (1 - 1/E)^(Bk)) of E experts on average under uniform routing, k at B=1. Caches, at a context of
`context` tokens a sequence: K and V rows (a sliding layer's window at most), MLA's latent rows, and a
GDN layer's states read and written once. Parameters are counted once each (a joined linear's members
are views of one matrix, at distinct offsets).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from atom_core.cache.specs import LatentCacheSpec, PagedKVSpec, StateCacheSpec
from atom_core.layers.moe import SparseMoE

EXPERT_STACKS = (  # with fp8 or MXFP4 scales, and biases
    "w13",
    "w2",
    "w13_scale_inv",
    "w2_scale_inv",
    "w13_mxfp4_scale",
    "w2_mxfp4_scale",
    "w13_bias",
    "w2_bias",
)


def experts_touched(num_experts: int, top_k: int, batch: int) -> float:
    """Expected distinct experts batch tokens of top_k picks reach, picks uniform (top_k at batch 1)."""
    if batch == 1:
        return float(top_k)
    return num_experts * (1 - (1 - 1 / num_experts) ** (batch * top_k))


def weight_bytes(model: nn.Module, batch: int) -> float:
    """Bytes of weights one decode step of batch sequences reads."""
    shares: dict[int, float] = {}  # parameter id -> the share of it read
    for module in model.modules():
        if isinstance(module, SparseMoE):
            share = experts_touched(module.num_experts, module.top_k, batch) / module.num_experts
            for name in EXPERT_STACKS:
                if (param := getattr(module, name, None)) is not None:
                    shares[id(param)] = share
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    skipped = set()
    if embedding is not None and not _tied(model, embedding.weight):
        skipped.add(id(embedding.weight))
    total, seen = 0.0, set()
    for param in model.parameters():
        if id(param) in seen or id(param) in skipped:
            continue
        seen.add(id(param))
        total += param.numel() * param.element_size() * shares.get(id(param), 1.0)
    return total


def _tied(model: nn.Module, weight: torch.Tensor) -> bool:
    head = getattr(model, "lm_head", None)
    return head is not None and getattr(head, "weight", None) is weight


def cache_bytes(model: nn.Module, batch: int, context: int, kv_dtype: torch.dtype) -> float:
    """Bytes of KV, latent and state caches one decode step reads (states also written)."""
    size = torch.empty((), dtype=kv_dtype).element_size()
    total = 0.0
    for module in model.modules():
        spec = getattr(module, "cache_spec", None)
        if isinstance(spec, PagedKVSpec):
            seen = context if spec.sliding_window is None else min(context, spec.sliding_window)
            total += 2 * spec.num_kv_heads * spec.head_dim * size * seen * batch
        elif isinstance(spec, LatentCacheSpec):
            total += spec.width * size * context * batch
        elif isinstance(spec, StateCacheSpec):
            for _, shape, dtype in spec.states:
                element = torch.empty((), dtype=dtype or kv_dtype).element_size()
                total += 2 * math.prod(shape) * element * batch
    return total
