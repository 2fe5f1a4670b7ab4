"""KV-cache write: token K/V [T, Hkv, D] into a paged cache by slot, any layout, bf16/fp16 or fp8."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.cache.fp8 import fp8_max, is_fp8, scale_kind
from atom_kernels.cache.layout import KVLayout, cache_geometry, cache_strides, layout_code, shuffle_width
from atom_kernels.cache.offsets import kv_offsets
from atom_kernels.cache.ref import write_kv_ref
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _quantize(x, scale_ptr, scale_off, mask_h, SCALE_KIND: tl.constexpr, FP8_MAX: tl.constexpr):
    """x: [BLOCK_H, BLOCK_D] fp32 -> x / scale, clamped to the fp8 range; stores per-token-head scales."""
    if SCALE_KIND == 2:
        absmax = tl.max(tl.abs(x), axis=1)
        scale = tl.where(absmax > 0, absmax / FP8_MAX, 1.0)
        tl.store(scale_ptr + scale_off, scale, mask=mask_h)
        x = x / scale[:, None]
    else:
        x = x / tl.load(scale_ptr)
    return tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    num_heads, head_dim, block_size, stride_cb, stride_cn, stride_ch,
    LAYOUT: tl.constexpr, X: tl.constexpr, SCALE_KIND: tl.constexpr, FP8_MAX: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk = slot // block_size
    off = slot % block_size
    h = tl.arange(0, BLOCK_H)[:, None].to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :].to(tl.int64)
    mask = (h < num_heads) & (d < head_dim)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask, other=0.0).to(tl.float32)
    if SCALE_KIND > 0:
        scale_off = (blk * num_heads + tl.arange(0, BLOCK_H)) * block_size + off
        mask_h = tl.arange(0, BLOCK_H) < num_heads
        k = _quantize(k, k_scale_ptr, scale_off, mask_h, SCALE_KIND, FP8_MAX)
        v = _quantize(v, v_scale_ptr, scale_off, mask_h, SCALE_KIND, FP8_MAX)
    k_off, v_off = kv_offsets(
        blk, off, h, d, num_heads, head_dim, block_size, stride_cb, stride_cn, stride_ch, LAYOUT, X
    )
    tl.store(k_cache_ptr + k_off, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + v_off, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    layout: KVLayout | str = KVLayout.FLASH,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> None:
    """Write token keys and values into a paged KV cache.

    k, v: [T, Hkv, D] (last dim contiguous); slot_mapping: [T] int (slot = block * block_size + offset,
    -1 = padding, skipped). Caches in `layout` (see atom_kernels.cache.layout). An fp8 cache needs
    k_scale and v_scale: one fp32 value each (per tensor, read), or [N, Hkv, block_size] fp32 (per token
    and head, written here as absmax / fp8 max).
    """
    layout = KVLayout(layout)
    num_blocks, block_size, num_heads, head_dim = cache_geometry(layout, k_cache, v_cache)
    tokens = k.shape[0]
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != (tokens, num_heads, head_dim) or x.stride(-1) != 1:
            raise ValueError(f"{name} must be [T, {num_heads}, {head_dim}] with a contiguous last dim")
    if slot_mapping.shape != (tokens,):
        raise ValueError(f"slot_mapping must be [{tokens}], got {tuple(slot_mapping.shape)}")
    kind = scale_kind(k_scale, num_blocks, num_heads, block_size)
    if kind != scale_kind(v_scale, num_blocks, num_heads, block_size):
        raise ValueError("k_scale and v_scale must be of one kind")
    if is_fp8(k_cache.dtype) != (kind > 0):
        raise ValueError("an fp8 cache needs k_scale and v_scale; a bf16/fp16 cache takes none")
    if resolve_backend(backend, k.device) is Backend.TORCH:
        write_kv_ref(k, v, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale)
        return
    if tokens == 0:
        return
    _write_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k_scale if kind else k, v_scale if kind else v,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        num_heads, head_dim, block_size, *cache_strides(layout, k_cache),
        LAYOUT=layout_code(layout, k_cache), X=shuffle_width(k_cache.dtype), SCALE_KIND=kind,
        FP8_MAX=fp8_max(k_cache.dtype) if kind else 1.0,
        BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4,
    )  # fmt: skip
