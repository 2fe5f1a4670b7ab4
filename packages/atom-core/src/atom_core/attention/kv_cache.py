"""The native backend's paged KV cache: one K/V tensor pair (and fp8 scales) per attention layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.config import CacheConfig, ModelConfig
from atom_kernels.cache import KVLayout, default_fp8_dtype, kv_cache_shapes


@dataclass(slots=True)
class LayerKVCache:
    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None  # fp8: per token and head [N, Hkv, block_size]
    v_scale: torch.Tensor | None = None


def kv_cache_dtype(model: ModelConfig, cache: CacheConfig, device: torch.device) -> torch.dtype:
    return default_fp8_dtype(device) if cache.kv_dtype == "fp8" else model.dtype


def allocate_kv_caches(
    model: ModelConfig, cache: CacheConfig, *, num_blocks: int, num_kv_heads: int, device: torch.device | str
) -> list[LayerKVCache]:
    """Zeroed caches for every layer. num_kv_heads: heads on this rank (after tensor-parallel split)."""
    device = torch.device(device)
    dtype = kv_cache_dtype(model, cache, device)
    k_shape, v_shape = kv_cache_shapes(
        KVLayout(cache.layout), num_blocks, cache.block_size, num_kv_heads, model.head_dim, dtype
    )
    caches = []
    for _ in range(model.num_hidden_layers):
        layer = LayerKVCache(
            torch.zeros(k_shape, dtype=dtype, device=device), torch.zeros(v_shape, dtype=dtype, device=device)
        )
        if cache.kv_dtype == "fp8":
            scale_shape = (num_blocks, num_kv_heads, cache.block_size)
            layer.k_scale = torch.ones(scale_shape, device=device)
            layer.v_scale = torch.ones(scale_shape, device=device)
        caches.append(layer)
    return caches


def kv_bytes_per_block(
    model: ModelConfig, cache: CacheConfig, num_kv_heads: int, device: torch.device
) -> int:
    """Bytes one block takes across all layers (K, V and fp8 scales): for sizing the cache from free memory."""
    itemsize = torch.empty((), dtype=kv_cache_dtype(model, cache, device)).element_size()
    per_layer = 2 * cache.block_size * num_kv_heads * model.head_dim * itemsize
    if cache.kv_dtype == "fp8":
        per_layer += 2 * cache.block_size * num_kv_heads * 4
    return per_layer * model.num_hidden_layers
