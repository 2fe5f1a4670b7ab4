"""Multimodal RoPE (Qwen2-VL/2.5-VL chunked sections, Qwen3-VL/3.5 interleaved) for q and k in place, in one
launch that reads the [3, T] positions itself: no gathered cos/sin tensor is built or read."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.rotary.ref import apply_mrope_ref
from atom_kernels.rotary.rope import ROUNDED_AS_TRANSFORMERS, _rotate_qk, apply_rotary, rotary_tiles
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _mrope_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    inv_freq_ptr,
    num_tokens,
    stride_pos,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    num_q_heads,
    num_k_heads,
    scaling,
    SECTION_T: tl.constexpr,
    SECTION_H: tl.constexpr,
    SECTION_W: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    NEOX: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < num_tokens
    i = tl.arange(0, BLOCK_HALF)[None, :]
    pos_t = tl.load(pos_ptr + t, mask=t_ok, other=0).to(tl.float32)[:, None]
    pos_h = tl.load(pos_ptr + stride_pos + t, mask=t_ok, other=0).to(tl.float32)[:, None]
    pos_w = tl.load(pos_ptr + 2 * stride_pos + t, mask=t_ok, other=0).to(tl.float32)[:, None]
    # Which position row turns frequency i: a compile-time pattern over i, shared by every token.
    if INTERLEAVED:
        use_h = (i % 3 == 1) & (i < 3 * SECTION_H)
        use_w = (i % 3 == 2) & (i < 3 * SECTION_W)
    else:
        use_h = (i >= SECTION_T) & (i < SECTION_T + SECTION_H)
        use_w = i >= SECTION_T + SECTION_H
    pos = tl.where(use_h, pos_h, tl.where(use_w, pos_w, pos_t))  # [BLOCK_T, BLOCK_HALF]
    angle = pos * tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0)
    _rotate_qk(
        q_ptr,
        k_ptr,
        t,
        t_ok,
        angle,
        scaling,
        stride_qt,
        stride_qh,
        stride_kt,
        stride_kh,
        num_q_heads,
        num_k_heads,
        NEOX,
        HALF,
        BLOCK_QH,
        BLOCK_KH,
        BLOCK_HALF,
    )


def apply_mrope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    rotary_dim: int,
    section: tuple[int, int, int] | list[int],
    interleaved: bool,
    scaling: float = 1.0,
    neox: bool = True,
    backend: Backend | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by 3-D positions; returns (q, k).

    positions: [3, T] int (rows T, H, W; a [T] tensor is text-only: every row equal, so plain RoPE);
    section: frequencies per axis, summing to rotary_dim / 2 ([16, 24, 24] for Qwen2-VL's chunked
    layout, [11, 11, 10] for Qwen3.5's interleaved one with rotary_dim 64 of head 256). Other arguments
    as `apply_rotary`.
    """
    if positions.dim() == 1:
        return apply_rotary(
            positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=scaling, neox=neox, backend=backend
        )
    section = tuple(int(s) for s in section)
    if len(section) != 3 or sum(section) != rotary_dim // 2 or min(section) < 0:
        raise ValueError(
            f"mrope section {list(section)} must be 3 sizes summing to rotary_dim / 2 = {rotary_dim // 2}"
        )
    if positions.dim() != 2 or positions.shape != (3, q.shape[0]) or positions.stride(-1) != 1:
        raise ValueError(f"positions must be [3, T={q.shape[0]}] (T/H/W rows), got {tuple(positions.shape)}")
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q and k must be [T, H, D] with one T and D, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if rotary_dim % 2 or not 0 < rotary_dim <= q.shape[2] or inv_freq.shape != (rotary_dim // 2,):
        raise ValueError(
            f"rotary_dim {rotary_dim} must be even, <= {q.shape[2]}, with inv_freq [rotary_dim / 2]"
        )
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k need a contiguous last dimension")
    if resolve_backend(backend, q.device) is Backend.TORCH:
        rq, rk = apply_mrope_ref(
            positions,
            q,
            k,
            inv_freq,
            rotary_dim=rotary_dim,
            section=section,
            interleaved=interleaved,
            scaling=scaling,
            neox=neox,
        )
        return q.copy_(rq), k.copy_(rk)
    if q.shape[0]:
        half = rotary_dim // 2
        block_qh, block_kh, block_half, block_t, warps = rotary_tiles(q.shape[1], k.shape[1], half)
        _mrope_kernel[(triton.cdiv(q.shape[0], block_t),)](
            positions,
            q,
            k,
            inv_freq,
            q.shape[0],
            positions.stride(0),
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            q.shape[1],
            k.shape[1],
            scaling,
            SECTION_T=section[0],
            SECTION_H=section[1],
            SECTION_W=section[2],
            INTERLEAVED=interleaved,
            NEOX=neox,
            HALF=half,
            BLOCK_QH=block_qh,
            BLOCK_KH=block_kh,
            BLOCK_HALF=block_half,
            BLOCK_T=block_t,
            num_warps=warps,
            **ROUNDED_AS_TRANSFORMERS,
        )
    return q, k
