"""Named paged KV-cache layouts (docs/architecture.md §3); write and read kernels of one layout agree on these.

flash:   K and V [num_blocks, block_size, Hkv, D]; contiguous, or any views with a unit D stride and one set
         of strides for K and V (vLLM packs K and V of a token-head side by side: V = K's storage + D)
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
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"K and V caches must be of one dtype, got {k_cache.dtype} and {v_cache.dtype}")
    if layout is KVLayout.FLASH:
        if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
            raise ValueError(
                f"flash K and V caches must share strides with a unit last stride, got {k_cache.stride()} "
                f"and {v_cache.stride()}"
            )
    elif not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("shuffle K and V caches must be contiguous")
    elif k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
        raise ValueError("shuffle K and V caches must start 16-byte aligned (their x-wide runs are 16 bytes)")
    return n, b, h, d


def layout_code(layout: KVLayout | str, k_cache: torch.Tensor) -> int:
    """The kernels' LAYOUT constant (see offsets.kv_offsets): 0 flash contiguous, 1 shuffle, 2 flash strided."""
    if KVLayout(layout) is KVLayout.SHUFFLE:
        return 1
    return 0 if k_cache.is_contiguous() else 2


def cache_strides(layout: KVLayout | str, k_cache: torch.Tensor) -> tuple[int, int, int]:
    """(block, token, head) element strides the kernels address a flash cache with (unused for shuffle)."""
    if KVLayout(layout) is KVLayout.FLASH:
        return k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)
    return 0, 0, 0
