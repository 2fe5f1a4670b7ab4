"""Pure-torch references for KV-cache writes and reads, in every layout and fp8 scale kind."""

from __future__ import annotations

import torch

from atom_kernels.cache.convert import to_flash
from atom_kernels.cache.fp8 import fp8_max, is_fp8
from atom_kernels.cache.layout import KVLayout, cache_geometry, shuffle_width


def quantize_ref(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype):
    """x: [T, Hkv, D]; scale: one value (per tensor), or None to compute one per token and head.

    Returns (x quantized to fp8, the per-token-head scales [T, Hkv] or None). A token-head's scale is
    absmax / fp8_max, or 1.0 when its row is all zeros.
    """
    xf = x.float()
    limit = fp8_max(fp8_dtype)
    if scale is None:
        absmax = xf.abs().amax(dim=-1)
        per_row = torch.where(absmax > 0, absmax / limit, torch.ones_like(absmax))
        return (xf / per_row[..., None]).clamp(-limit, limit).to(fp8_dtype), per_row
    return (xf / scale.float().reshape(())).clamp(-limit, limit).to(fp8_dtype), None


def write_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layout: KVLayout | str = KVLayout.FLASH,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write k, v [T, Hkv, D] into the caches at slot_mapping [T] (slot = block * B + offset; -1: skip)."""
    layout = KVLayout(layout)
    _, block_size, _, _ = cache_geometry(layout, k_cache, v_cache)
    keep = slot_mapping >= 0
    k, v, slots = k[keep], v[keep], slot_mapping[keep].long()
    blk, off = slots // block_size, slots % block_size
    if is_fp8(k_cache.dtype):
        k, v = (
            _quantize_into_scales(k, k_scale, blk, off, k_cache.dtype),
            _quantize_into_scales(v, v_scale, blk, off, k_cache.dtype),
        )
    else:
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    if layout is KVLayout.FLASH:
        k_cache[blk, off] = k
        v_cache[blk, off] = v
        return
    x = shuffle_width(k_cache.dtype)
    t, h, d = k.shape
    k_cache[blk, :, :, off, :] = k.view(t, h, d // x, x)
    v_cache[blk, :, off // x, :, off % x] = v


def _quantize_into_scales(x, scale, blk, off, fp8_dtype):
    if scale is None:
        raise ValueError("an fp8 cache needs k_scale and v_scale")
    per_token = scale.numel() != 1
    quantized, rows = quantize_ref(x, None if per_token else scale, fp8_dtype)
    if per_token:
        scale[blk, :, off] = rows  # [N, Hkv, B] at (block, :, offset)
    return quantized


def read_kv_ref(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    length: int,
    layout: KVLayout | str = KVLayout.FLASH,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first `length` tokens from the cache, as fp32 K, V [length, Hkv, D] (dequantized).

    block_table: [max_pages] physical block ids of the sequence (entries past its pages are not read).
    """
    _, block_size, _, _ = cache_geometry(layout, k_cache, v_cache)
    pages = block_table[: -(-length // block_size)].long()
    k_flash, v_flash = to_flash(layout, k_cache, v_cache)
    out = []
    for cache, scale in ((k_flash, k_scale), (v_flash, v_scale)):
        x = cache[pages].float()  # [P, B, Hkv, D]
        if scale is not None:
            if scale.numel() == 1:
                x = x * scale.float().reshape(())
            else:
                x = x * scale[pages].permute(0, 2, 1)[..., None]  # [P, Hkv, B] -> [P, B, Hkv, 1]
        out.append(x.reshape(-1, *x.shape[2:])[:length])
    return out[0], out[1]
