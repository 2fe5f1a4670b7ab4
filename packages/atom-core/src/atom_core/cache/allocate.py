"""Allocation and sizing of the caches a model's layers declare (the native engine's memory)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from atom_core.cache.specs import CacheSpec, LatentCacheSpec, PagedKVSpec, StateCacheSpec
from atom_core.config import CacheConfig
from atom_core.host_copy import to_device
from atom_kernels.cache import KVLayout, default_fp8_dtype, kv_cache_shapes


@dataclass(slots=True)
class LayerKVCache:
    """A PagedKVSpec layer's pages: K and V in the configured layout (and fp8 scales)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None  # fp8: per token and head [N, Hkv, block_size]
    v_scale: torch.Tensor | None = None


@dataclass(slots=True)
class LatentCache:
    """A LatentCacheSpec layer's pages: rows [N, block_size, width] (and the fp8 per-tensor scale [1])."""

    rows: torch.Tensor
    scale: torch.Tensor | None = None


@dataclass(slots=True)
class StateCache:
    """A StateCacheSpec layer's slots: each named state as [num_slots, *shape]."""

    states: dict[str, torch.Tensor] = field(default_factory=dict)


LayerCache = LayerKVCache | LatentCache | StateCache


def copy_state_rows(
    caches: Sequence[LayerCache], pairs: Sequence[tuple[int, int]], device: torch.device
) -> None:
    """Copy every state layer's slot rows source -> destination, for each (source, destination) in pairs
    (snapshots into and out of running slots), in one index copy each."""
    if not pairs:
        return
    src, dst = to_device([list(x) for x in zip(*pairs, strict=True)], torch.long, device)
    for cache in caches:
        if isinstance(cache, StateCache):
            for tensor in cache.states.values():
                tensor[dst] = tensor[src]


def paged_dtype(model_dtype: torch.dtype, cache: CacheConfig, device: torch.device) -> torch.dtype:
    return default_fp8_dtype(device) if cache.kv_dtype == "fp8" else model_dtype


def allocate_caches(
    specs: Sequence[CacheSpec],
    cache: CacheConfig,
    *,
    dtype: torch.dtype,
    num_blocks: int,
    num_slots: int = 0,
    device: torch.device | str,
) -> list[LayerCache]:
    """Zeroed caches, one per spec (same order). dtype: the model's; num_blocks: pages per paged layer;
    num_slots: sequences a state layer holds at once."""
    device = torch.device(device)
    return [_allocate(spec, cache, dtype, num_blocks, num_slots, device) for spec in specs]


def _allocate(spec, cache: CacheConfig, dtype, num_blocks: int, num_slots: int, device) -> LayerCache:
    fp8 = cache.kv_dtype == "fp8"
    if isinstance(spec, PagedKVSpec):
        kv_dtype = paged_dtype(dtype, cache, device)
        k_shape, v_shape = kv_cache_shapes(
            KVLayout(cache.layout), num_blocks, cache.block_size, spec.num_kv_heads, spec.head_dim, kv_dtype
        )
        layer = LayerKVCache(
            torch.zeros(k_shape, dtype=kv_dtype, device=device),
            torch.zeros(v_shape, dtype=kv_dtype, device=device),
        )
        if fp8:
            scale_shape = (num_blocks, spec.num_kv_heads, cache.block_size)
            layer.k_scale = torch.ones(scale_shape, device=device)
            layer.v_scale = torch.ones(scale_shape, device=device)
        return layer
    if isinstance(spec, LatentCacheSpec):
        rows = torch.zeros(
            num_blocks, cache.block_size, spec.width, dtype=paged_dtype(dtype, cache, device), device=device
        )
        return LatentCache(rows, torch.ones(1, device=device) if fp8 else None)
    if isinstance(spec, StateCacheSpec):
        return StateCache(
            {
                name: torch.zeros(num_slots, *shape, dtype=state_dtype or dtype, device=device)
                for name, shape, state_dtype in spec.states
            }
        )
    raise TypeError(f"no allocation for cache spec {spec!r}")


def bytes_per_block(
    specs: Sequence[CacheSpec], cache: CacheConfig, *, dtype: torch.dtype, device: torch.device
) -> int:
    """Bytes one page of block_size tokens takes across all paged layers (values and fp8 scales)."""
    itemsize = torch.empty((), dtype=paged_dtype(dtype, cache, device)).element_size()
    fp8 = cache.kv_dtype == "fp8"
    total = 0
    for spec in specs:
        if isinstance(spec, PagedKVSpec):
            total += 2 * cache.block_size * spec.num_kv_heads * (spec.head_dim * itemsize + (4 if fp8 else 0))
        elif isinstance(spec, LatentCacheSpec):
            total += cache.block_size * spec.width * itemsize
    return total


def bytes_per_slot(specs: Sequence[CacheSpec], *, dtype: torch.dtype) -> int:
    """Bytes one sequence's state takes across all state layers."""
    total = 0
    for spec in specs:
        if isinstance(spec, StateCacheSpec):
            for _, shape, state_dtype in spec.states:
                total += math.prod(shape) * torch.empty((), dtype=state_dtype or dtype).element_size()
    return total
