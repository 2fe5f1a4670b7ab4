"""KV-cache write: token K/V [T, Hkv, D] into a paged cache by slot, any layout, bf16/fp16 or fp8."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.cache.fp8 import fp8_max, is_fp8, scale_kind
from atom_kernels.cache.layout import KVLayout, cache_geometry, cache_strides, layout_code, shuffle_width
from atom_kernels.cache.offsets import kv_offsets, shuffle_run_offsets
from atom_kernels.cache.ref import write_kv_ref
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _quantize(x, scale_ptr, scale_off, scale_mask, SCALE_KIND: tl.constexpr, FP8_MAX: tl.constexpr):
    """x: [BLOCK_H, BLOCK_D, BLOCK_T] fp32 -> x / scale, clamped to the fp8 range; per token and head
    (SCALE_KIND 2) stores the scales, [BLOCK_H, 1, BLOCK_T] offsets."""
    if SCALE_KIND == 2:
        absmax = tl.max(tl.abs(x), axis=1, keep_dims=True)
        scale = tl.where(absmax > 0, absmax / FP8_MAX, 1.0)
        tl.store(scale_ptr + scale_off, scale, mask=scale_mask)
        x = x / scale
    else:
        x = x / tl.load(scale_ptr)
    return tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)


@triton.jit
def _store_by_element(
    k_cache_ptr, v_cache_ptr, k, v, blk, off, h, d, mask, num_heads, head_dim, block_size, stride_cb, stride_cn,
    stride_ch, LAYOUT: tl.constexpr, X: tl.constexpr,
):  # fmt: skip
    """Each token at its own slot's offsets (any layout, any slots)."""
    k_off, v_off = kv_offsets(
        blk, off, h, d, num_heads, head_dim, block_size, stride_cb, stride_cn, stride_ch, LAYOUT, X
    )
    tl.store(k_cache_ptr + k_off, k, mask=mask)
    tl.store(v_cache_ptr + v_off, v, mask=mask)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    tokens, stride_kt, stride_kh, stride_vt, stride_vh,
    num_heads, head_dim, block_size, stride_cb, stride_cn, stride_ch,
    LAYOUT: tl.constexpr, X: tl.constexpr, SCALE_KIND: tl.constexpr, FP8_MAX: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # Tiles [heads, dims, tokens] with the tokens innermost: the shuffle V layout puts x consecutive
    # slots of one (head, dim) next to each other, so a group of tokens with consecutive slots (a
    # prefill's page) is stored by neighbouring lanes; the other stores are contiguous along dims.
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)[None, None, :]
    h = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None, None]
    d = tl.arange(0, BLOCK_D).to(tl.int64)[None, :, None]
    slot = tl.load(slot_ptr + t, mask=t < tokens, other=-1).to(tl.int64)
    live = slot >= 0  # -1: padding, not written
    slot = tl.where(live, slot, 0)
    blk = slot // block_size
    off = slot % block_size
    mask = live & (h < num_heads) & (d < head_dim)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask, other=0.0).to(tl.float32)
    if SCALE_KIND > 0:
        scale_off = (blk * num_heads + h) * block_size + off
        scale_mask = live & (h < num_heads)
        k = _quantize(k, k_scale_ptr, scale_off, scale_mask, SCALE_KIND, FP8_MAX)
        v = _quantize(v, v_scale_ptr, scale_off, scale_mask, SCALE_KIND, FP8_MAX)
    k = k.to(k_cache_ptr.dtype.element_ty)
    v = v.to(v_cache_ptr.dtype.element_ty)
    if LAYOUT == 1 and BLOCK_T == X:  # compile-time: only shuffle groups can hold a whole run
        i = tl.arange(0, BLOCK_T)[None, None, :]
        first = tl.max(tl.where(i == 0, slot, 0))  # the group's first slot (0 when it is padding)
        in_run = tl.sum((live & (slot == first + i)).to(tl.int32))
        if in_run == BLOCK_T and first % X == 0:
            # x consecutive slots from a multiple of x (a prefill's page): whole 16-byte V runs
            k_off, v_off = shuffle_run_offsets(first // block_size, first % block_size, h, d, i, num_heads,
                                               head_dim, block_size, X)  # fmt: skip
            run_mask = (h < num_heads) & (d < head_dim)
            tl.store(k_cache_ptr + k_off, k, mask=run_mask)
            tl.store(v_cache_ptr + v_off, v, mask=run_mask)
        else:
            _store_by_element(k_cache_ptr, v_cache_ptr, k, v, blk, off, h, d, mask, num_heads, head_dim, block_size,
                              stride_cb, stride_cn, stride_ch, LAYOUT, X)  # fmt: skip
    else:
        _store_by_element(k_cache_ptr, v_cache_ptr, k, v, blk, off, h, d, mask, num_heads, head_dim, block_size,
                          stride_cb, stride_cn, stride_ch, LAYOUT, X)  # fmt: skip


def write_tiles(layout: KVLayout, num_heads: int, head_dim: int, x: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_D): flash writes one token per program (80% of copy bandwidth on the
    H200 at T=16k); shuffle writes x tokens per program, so a page's consecutive slots fill whole
    16-byte V runs within one store. Head blocks keep a tile at <= 8k elements."""
    block_d = triton.next_power_of_2(head_dim)
    block_t = x if layout is KVLayout.SHUFFLE else 1
    block_h = min(triton.next_power_of_2(num_heads), max(1, 8192 // (block_d * block_t)))
    return block_t, block_h, block_d


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
    x = shuffle_width(k_cache.dtype)
    block_t, block_h, block_d = write_tiles(layout, num_heads, head_dim, x)
    _write_kv_kernel[(triton.cdiv(tokens, block_t), triton.cdiv(num_heads, block_h))](
        k, v, k_cache, v_cache, slot_mapping,
        k_scale if kind else k, v_scale if kind else v,
        tokens, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        num_heads, head_dim, block_size, *cache_strides(layout, k_cache),
        LAYOUT=layout_code(layout, k_cache), X=x, SCALE_KIND=kind,
        FP8_MAX=fp8_max(k_cache.dtype) if kind else 1.0, BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4 if block_t * block_h * block_d <= 4096 else 8,
    )  # fmt: skip
