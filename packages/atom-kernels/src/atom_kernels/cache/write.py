"""KV-cache write: token K/V [T, Hkv, D] into a paged cache by slot, any layout, bf16/fp16 or fp8.

The flash layout is written here, one token per program; the shuffle layout in write_shuffle.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.cache.fp8 import fp8_max, is_fp8, scale_kind
from atom_kernels.cache.layout import KVLayout, cache_geometry, cache_strides, layout_code, shuffle_width
from atom_kernels.cache.offsets import kv_offsets
from atom_kernels.cache.packs import CacheSlots, new_rows
from atom_kernels.cache.quantize import quantize_rows
from atom_kernels.cache.ref import write_kv_ref
from atom_kernels.cache.write_shuffle import shuffle_write_tiles, write_shuffle_kernel
from atom_kernels.cache.write_shuffle_e4m3 import e4m3_shuffle_write_kernel, e4m3_shuffle_write_supported
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _write_flash_kernel(
    src,
    dst,
    head_dim,
    stride_cb,
    stride_cn,
    stride_ch,
    LAYOUT: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """src: packs.NewRows; dst: packs.CacheSlots. Program (token, head block): a token's heads are one
    contiguous row of the cache."""
    num_heads, block_size = dst.num_heads, dst.block_size
    t = tl.program_id(0).to(tl.int64)
    h = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
    d = tl.arange(0, BLOCK_D).to(tl.int64)[None, :]
    slot = tl.load(dst.slots + t).to(tl.int64)
    if slot < 0:  # -1: padding, not written
        return
    blk = slot // block_size
    off = slot % block_size
    mask = (h < num_heads) & (d < head_dim)
    k = tl.load(src.k + t * src.stride_kt + h * src.stride_kh + d, mask=mask, other=0.0)
    v = tl.load(src.v + t * src.stride_vt + h * src.stride_vh + d, mask=mask, other=0.0)
    if SCALE_KIND > 0:
        scale_off = (blk * num_heads + h) * block_size + off
        k = quantize_rows(k, dst.k_scale, scale_off, h < num_heads, SCALE_KIND, FP8_MAX)
        v = quantize_rows(v, dst.v_scale, scale_off, h < num_heads, SCALE_KIND, FP8_MAX)
    k_off, v_off = kv_offsets(
        blk, off, h, d, num_heads, head_dim, block_size, stride_cb, stride_cn, stride_ch, LAYOUT, 1
    )
    tl.store(dst.k_cache + k_off, k.to(dst.k_cache.dtype.element_ty), mask=mask)
    tl.store(dst.v_cache + v_off, v.to(dst.v_cache.dtype.element_ty), mask=mask)


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
    block_d = triton.next_power_of_2(head_dim)
    src = new_rows(k, v)
    scales = (k_scale, v_scale) if kind else (k, v)
    dst = CacheSlots(k_cache, v_cache, slot_mapping, *scales, num_heads, block_size)
    fmax = fp8_max(k_cache.dtype) if kind else 1.0
    if layout is KVLayout.SHUFFLE and e4m3_shuffle_write_supported(k, k_cache):
        page = block_size if block_size & (block_size - 1) == 0 else 0
        e4m3_shuffle_write_kernel[(triton.cdiv(tokens, 16), num_heads)](
            src, dst, HEAD_DIM=head_dim, SCALE_KIND=kind, FP8_MAX=fmax, PAGE=page, num_warps=1, maxnreg=128,
        )  # fmt: skip
        return
    if layout is KVLayout.SHUFFLE:
        x = shuffle_width(k_cache.dtype)
        block_h, warps = shuffle_write_tiles(num_heads, head_dim, x)
        write_shuffle_kernel[(triton.cdiv(tokens, x), triton.cdiv(num_heads, block_h))](
            src, dst, HEAD_DIM=head_dim, X=x, SCALE_KIND=kind, FP8_MAX=fmax, BLOCK_H=block_h,
            BLOCK_D=block_d, num_warps=warps,
        )  # fmt: skip
        return
    # One token per program, all heads; warps from benchmarks/sweep_kv_write.py. Per-token scales reduce
    # each head's row, which one warp does without a shared-memory round trip: faster than 4 warps there.
    block_h = min(triton.next_power_of_2(num_heads), max(1, 8192 // block_d))
    warps = 1 if kind == 2 else 4 if block_h * block_d <= 4096 else 8
    _write_flash_kernel[(tokens, triton.cdiv(num_heads, block_h))](
        src, dst, head_dim, *cache_strides(layout, k_cache), LAYOUT=layout_code(layout, k_cache),
        SCALE_KIND=kind, FP8_MAX=fmax, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=warps,
    )  # fmt: skip
