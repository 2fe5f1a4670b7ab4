"""Conversions between the flash and shuffle layouts (pure permutations; scales keep their layout)."""

from __future__ import annotations

import torch

from atom_kernels.cache.layout import KVLayout, shuffle_width


def to_flash(layout: KVLayout | str, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """K, V as [N, B, Hkv, D] (a copy for shuffle, the same tensors for flash)."""
    if KVLayout(layout) is KVLayout.FLASH:
        return k_cache, v_cache
    n, h, dx, b, x = k_cache.shape
    k = k_cache.permute(0, 3, 1, 2, 4).reshape(n, b, h, dx * x)  # [N, H, D/x, B, x] -> [N, B, H, D]
    v = v_cache.permute(0, 2, 4, 1, 3).reshape(n, b, h, dx * x)  # [N, H, B/x, D, x] -> [N, B, H, D]
    return k, v


def flash_to_shuffle(k_cache: torch.Tensor, v_cache: torch.Tensor):
    """[N, B, Hkv, D] K and V -> shuffle K [N, Hkv, D//x, B, x] and V [N, Hkv, B//x, D, x] (copies)."""
    n, b, h, d = k_cache.shape
    x = shuffle_width(k_cache.dtype)
    k = k_cache.view(n, b, h, d // x, x).permute(0, 2, 3, 1, 4).contiguous()
    v = v_cache.view(n, b // x, x, h, d).permute(0, 3, 1, 4, 2).contiguous()
    return k, v
