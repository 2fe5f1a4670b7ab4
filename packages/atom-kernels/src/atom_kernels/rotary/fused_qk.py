"""q/k RMSNorm (optional), rotary (plain or multimodal) and the KV-cache write in one pass over q, k and v.

Qwen3-Next and Qwen3.5 attention normalizes each head of q and k (zero-centred weights), rotates the first
rotary_dim dims (64 of 256) and writes k and v to the paged cache: four launches and three round trips
through memory when done one by one. Here two programs per token read its rows once (the q heads; the k
heads with their v rows), normalize, rotate (cos and sin made once per token) and store them: q to q_out,
k and v into the cache. Models without q/k norms (Llama) pass no weights: rotary and the write are still
two launches saved into one. Rounding is the unfused kernels' (rms_norm, apply_rotary / apply_mrope),
which is transformers'.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from atom_kernels.cache.layout import KVLayout, cache_geometry
from atom_kernels.cache.ref import write_kv_ref
from atom_kernels.norm.ref import rms_norm_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.rotary.packs import head_rows
from atom_kernels.rotary.ref import apply_mrope_ref, apply_rotary_ref, mrope_axes
from atom_kernels.rotary.rope import ROUNDED_AS_TRANSFORMERS
from atom_kernels.settings import Backend, resolve_backend


class QKNorms(NamedTuple):
    """The q and k RMSNorm weights [D] ((weight + weight_offset) scales), unread without NORM."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float
    weight_offset: float


class Rotation(NamedTuple):
    """Positions [T] (or [3, T] rows stride_pos apart, each frequency's row in axes [HALF]) and inv_freq."""

    positions: torch.Tensor
    axes: torch.Tensor
    inv_freq: torch.Tensor
    stride_pos: int
    scaling: float


class FlashSlots(NamedTuple):
    """A flash-layout cache written at slots [T] (-1: not written)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slots: torch.Tensor
    block_size: int
    stride_cb: int
    stride_cn: int
    stride_ch: int


@triton.jit
def _norm_rope_tile(
    rows,
    t,
    w_ptr,
    norms,
    d,
    partner,
    cos,
    sin,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    NORM: tl.constexpr,
):
    """Token t's heads of rows (packs.HeadRows) [BLOCK_H, D] -> with NORM normalized (rounded to the rows'
    dtype, times the weight w_ptr [D], rounded), then the first 2 * HALF dims rotated by (cos, sin) [D] of
    each dim's frequency; each rotated dim's partner is read again (registers cannot be permuted).
    Returns (tile, its head mask)."""
    src = rows.x + t * rows.stride_t
    dt = src.dtype.element_ty
    h = tl.arange(0, BLOCK_H)[:, None]
    mask = h < rows.num_heads
    y = tl.load(src + h * rows.stride_h + d[None, :], mask=mask, other=0.0).to(tl.float32)
    yp = tl.load(src + h * rows.stride_h + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(y * y, axis=1, keep_dims=True) / D + norms.eps)
        w = tl.load(w_ptr + d).to(tl.float32) + norms.weight_offset
        w = w.to(w_ptr.dtype.element_ty).to(tl.float32)
        y = (w[None, :] * (y * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        wp = tl.load(w_ptr + partner).to(tl.float32) + norms.weight_offset
        wp = wp.to(w_ptr.dtype.element_ty).to(tl.float32)
        yp = (wp[None, :] * (yp * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    a = (y * cos[None, :]).to(dt).to(tl.float32)
    b = (yp * sin[None, :]).to(dt).to(tl.float32)
    rotated, first_half = d < 2 * HALF, d < HALF
    out = tl.where(rotated[None, :], tl.where(first_half[None, :], a - b, a + b), y).to(dt)
    return out, mask


@triton.jit
def _qk_norm_rope_write_kernel(
    q,
    k,
    v,
    out,
    norms,
    rope,
    cache,
    D: tl.constexpr,
    HALF: tl.constexpr,
    MROPE: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (token, 0): all its q heads into out; (token, 1): its k heads and v rows, into the cache.
    q, k, v, out: packs.HeadRows; norms: QKNorms; rope: Rotation; cache: FlashSlots."""
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    rotated = d < 2 * HALF
    first_half = d < HALF
    partner = tl.where(rotated, tl.where(first_half, d + HALF, d - HALF), d)
    freq = tl.where(first_half, d, d - HALF) % HALF
    axis = tl.load(rope.axes + freq) if MROPE else tl.zeros([D], tl.int64)
    angle = tl.load(rope.positions + axis * rope.stride_pos + t).to(tl.float32) * tl.load(
        rope.inv_freq + freq
    )
    dt = q.x.dtype.element_ty  # k's too (checked by the wrapper)
    cos = (tl.cos(angle) * rope.scaling).to(dt).to(tl.float32)
    sin = (tl.sin(angle) * rope.scaling).to(dt).to(tl.float32)
    if tl.program_id(1) == 0:
        y, mask = _norm_rope_tile(q, t, norms.q_weight, norms, d, partner, cos, sin, D, HALF, BLOCK_QH, NORM)
        h = tl.arange(0, BLOCK_QH)[:, None]
        tl.store(out.x + t * out.stride_t + h * out.stride_h + d[None, :], y, mask=mask)
    else:
        slot = tl.load(cache.slots + t).to(tl.int64)
        if slot >= 0:  # -1: padding, nothing written
            y, mask = _norm_rope_tile(
                k, t, norms.k_weight, norms, d, partner, cos, sin, D, HALF, BLOCK_KH, NORM
            )
            h = tl.arange(0, BLOCK_KH)[:, None]
            row = (slot // cache.block_size) * cache.stride_cb + (slot % cache.block_size) * cache.stride_cn
            row = row + h * cache.stride_ch + d[None, :]
            tl.store(cache.k_cache + row, y.to(cache.k_cache.dtype.element_ty), mask=mask)
            vals = tl.load(v.x + t * v.stride_t + h * v.stride_h + d[None, :], mask=mask)
            tl.store(cache.v_cache + row, vals.to(cache.v_cache.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=64)
def _device_axes(
    half: int, section: tuple[int, ...], interleaved: bool, device: torch.device
) -> torch.Tensor:
    """The frequencies' position rows on the device, made once (a CUDA graph capture cannot copy them)."""
    return mrope_axes(half, section, interleaved).to(device)


def qk_norm_rope_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    eps: float,
    rotary_dim: int,
    weight_offset: float = 0.0,
    scaling: float = 1.0,
    mrope_section: tuple[int, int, int] | None = None,
    mrope_interleaved: bool = False,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """RMSNorm each head of q [T, Hq, D] and k [T, Hkv, D] ((weight + weight_offset) scaled, weights [D];
    both None: no norm), rotate their first rotary_dim dims (neox pairs) by positions [T] (or [3, T] with
    mrope_section), write k and v [T, Hkv, D] into a flash-layout bf16/fp16/fp32 cache by slot_mapping [T]
    (-1: skipped) and return the normalized, rotated q (into `out` [T, Hq, D] if given). q, k, v may be strided views with
    a contiguous last dim (q and k of a fused projection). D must be a power of two. One launch.
    """
    tokens, num_q_heads, dim = q.shape
    num_kv_heads = k.shape[1]
    if k.shape != (tokens, num_kv_heads, dim) or v.shape != k.shape:
        raise ValueError(
            f"q [T, Hq, D] and k, v [T, Hkv, D] expected, got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if min(x.stride(-1) for x in (q, k, v)) != 1 or triton.next_power_of_2(dim) != dim:
        raise ValueError(f"q, k, v need a contiguous last dim and a power-of-two head dim, got D={dim}")
    norm = q_weight is not None
    if (k_weight is not None) != norm:
        raise ValueError("q_weight and k_weight are given together (the q/k norms) or both None")
    if norm and (q_weight.shape != (dim,) or k_weight.shape != (dim,)):
        raise ValueError(f"q_weight and k_weight must be [{dim}]")
    if rotary_dim % 2 or not 0 < rotary_dim <= dim or inv_freq.shape != (rotary_dim // 2,):
        raise ValueError(f"rotary_dim {rotary_dim} must be even, <= {dim}, with inv_freq [rotary_dim / 2]")
    expected = (3, tokens) if mrope_section is not None else (tokens,)
    if tuple(positions.shape) != expected:
        raise ValueError(f"positions must be {list(expected)}, got {list(positions.shape)}")
    if cache_geometry(KVLayout.FLASH, k_cache, v_cache)[2:] != (num_kv_heads, dim):
        raise ValueError(f"the cache must hold {num_kv_heads} heads of {dim}")
    if k_cache.element_size() == 1:
        raise ValueError("qk_norm_rope_write writes bf16/fp16/fp32 caches; fp8 caches go through write_kv")
    if out is None:
        out = torch.empty(tokens, num_q_heads, dim, dtype=q.dtype, device=q.device)
    positions = positions.contiguous()  # the kernel steps one token at a time along a row
    if resolve_backend(backend, q.device) is Backend.TORCH:
        qn, kn = q, k
        if norm:
            qn = rms_norm_ref(q.reshape(-1, dim), q_weight, eps, weight_offset=weight_offset).view(q.shape)
            kn = rms_norm_ref(k.reshape(-1, dim), k_weight, eps, weight_offset=weight_offset).view(k.shape)
        rope = dict(rotary_dim=rotary_dim, scaling=scaling)
        if mrope_section is None:
            qr, kr = apply_rotary_ref(positions, qn, kn, inv_freq, **rope)
        else:
            section = tuple(mrope_section)
            qr, kr = apply_mrope_ref(
                positions, qn, kn, inv_freq, section=section, interleaved=mrope_interleaved, **rope,
            )  # fmt: skip
        write_kv_ref(kr, v, k_cache, v_cache, slot_mapping, KVLayout.FLASH, None, None)
        return out.copy_(qr)
    if tokens == 0:
        return out
    half = rotary_dim // 2
    axes = inv_freq  # unused without mrope
    if mrope_section is not None:
        axes = _device_axes(half, tuple(mrope_section), mrope_interleaved, q.device)
    block_qh, block_kh = triton.next_power_of_2(num_q_heads), triton.next_power_of_2(num_kv_heads)
    pdl = pdl_launch(q.device)
    placeholder = inv_freq  # never read without NORM
    norms = QKNorms(q_weight if norm else placeholder, k_weight if norm else placeholder, eps, weight_offset)
    stride_pos = positions.stride(0) if mrope_section is not None else 0
    rope = Rotation(positions, axes, inv_freq, stride_pos, scaling)
    cache = FlashSlots(k_cache, v_cache, slot_mapping, k_cache.shape[1], *k_cache.stride()[:3])
    # Without the norms LLVM would fuse a rounded product into the rotation's sum (the norms' select
    # keeps it from doing so): launched as the plain rotary kernels are (test_rotary_rounding_sm90.py).
    _qk_norm_rope_write_kernel[(tokens, 2)](
        *(head_rows(x) for x in (q, k, v, out)), norms, rope, cache, D=dim, HALF=half,
        MROPE=mrope_section is not None, NORM=norm, BLOCK_QH=block_qh, BLOCK_KH=block_kh, PDL=pdl,
        num_warps=max(1, min(8, block_qh * dim // 1024)), launch_pdl=pdl,
        **({} if norm else ROUNDED_AS_TRANSFORMERS),
    )  # fmt: skip
    return out
