"""Named paged KV-cache layouts (DESIGN.md §3); write and read kernels of one layout agree on these.

flash:   K and V [num_blocks, block_size, Hkv, D]
shuffle: K [num_blocks, Hkv, D // x, block_size, x], V [num_blocks, Hkv, block_size // x, D, x],
         x = 16 // itemsize (16-byte vectors; the ROCm asm/aiter layout)
Scales of fp8 caches are per tensor (one fp32) or per token and head: [num_blocks, Hkv, block_size] fp32.
"""

from __future__ import annotations

import enum

import torch


class KVLayout(enum.StrEnum):
    FLASH = "flash"
    SHUFFLE = "shuffle"


def shuffle_width(dtype: torch.dtype) -> int:
    """x: how many elements make a 16-byte vector."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def kv_cache_shapes(
    layout: KVLayout | str,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(K shape, V shape) of a cache in `layout`."""
    layout = KVLayout(layout)
    if layout is KVLayout.FLASH:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return shape, shape
    x = shuffle_width(dtype)
    if head_dim % x or block_size % x:
        raise ValueError(f"shuffle layout needs head_dim and block_size divisible by x={x} for {dtype}")
    k = (num_blocks, num_kv_heads, head_dim // x, block_size, x)
    v = (num_blocks, num_kv_heads, block_size // x, head_dim, x)
    return k, v


def cache_geometry(
    layout: KVLayout | str, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> tuple[int, int, int, int]:
    """(num_blocks, block_size, Hkv, D) of a K/V cache pair, checking that the pair is one valid cache."""
    layout = KVLayout(layout)
    if layout is KVLayout.FLASH:
        if k_cache.dim() != 4:
            raise ValueError(f"flash K cache must be [N, B, Hkv, D], got {tuple(k_cache.shape)}")
        n, b, h, d = k_cache.shape
    else:
        if k_cache.dim() != 5:
            raise ValueError(f"shuffle K cache must be [N, Hkv, D//x, B, x], got {tuple(k_cache.shape)}")
        n, h, dx, b, x = k_cache.shape
        d = dx * x
    expected = kv_cache_shapes(layout, n, b, h, d, k_cache.dtype)
    if tuple(k_cache.shape) != expected[0] or tuple(v_cache.shape) != expected[1]:
        raise ValueError(
            f"{layout} cache shapes K {tuple(k_cache.shape)} V {tuple(v_cache.shape)} do not match "
            f"{expected} for block_size={b}, Hkv={h}, D={d}, {k_cache.dtype}"
        )
    if v_cache.dtype != k_cache.dtype or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("K and V caches must be contiguous and of one dtype")
    return n, b, h, d
