"""Rotary embeddings for q and k in place, in one launch: angles from positions and inv_freq in fp32,
rounded as transformers rounds (see ref.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.rotary.packs import check_rotation, head_rows
from atom_kernels.rotary.ref import apply_rotary_ref
from atom_kernels.settings import Backend, resolve_backend

# Launch options of the rotary kernels. No FMA contraction: LLVM narrows the rounded products to bf16
# multiplies and would fuse one into the sum, rounding once where transformers rounds each product (some
# bf16 outputs differ with it, none without; test_rotary_rounding_sm90.py).
ROUNDED_AS_TRANSFORMERS = {"enable_fp_fusion": False}


def rotary_tiles(num_q_heads: int, num_k_heads: int, half: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_QH, BLOCK_KH, BLOCK_HALF, BLOCK_T, num_warps) of a launch: BLOCK_T tokens per program.

    One token per program with one or two warps, which benchmarks/sweep_rotary.py found faster than every
    multi-token tile and than 4-8 warps: small programs pack more loads in flight per SM.
    """
    block_qh, block_kh, block_half = (triton.next_power_of_2(n) for n in (num_q_heads, num_k_heads, half))
    per_token = (block_qh + block_kh) * block_half
    return block_qh, block_kh, block_half, 1, 1 if per_token <= 1024 else 2


@triton.jit
def _rotate(
    rows,
    t,
    t_ok,
    cos,
    sin,
    NEOX: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """rows (packs.HeadRows) of tokens t (a [BLOCK_T, 1, 1] tile) in place; cos/sin [BLOCK_T, 1, BLOCK_HALF]
    fp32."""
    h = tl.arange(0, BLOCK_H)[None, :, None]
    i = tl.arange(0, BLOCK_HALF)[None, None, :]
    mask = t_ok & (h < rows.num_heads) & (i < HALF)
    base = rows.x + t * rows.stride_t + h * rows.stride_h
    if NEOX:
        p1, p2 = base + i, base + HALF + i
    else:
        p1, p2 = base + 2 * i, base + 2 * i + 1
    # Rounded where transformers rounds: cos/sin, each product and the sum in the activations' dtype.
    dt = rows.x.dtype.element_ty
    cos = cos.to(dt).to(tl.float32)
    sin = sin.to(dt).to(tl.float32)
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    o1 = (x1 * cos).to(dt).to(tl.float32) - (x2 * sin).to(dt).to(tl.float32)
    o2 = (x2 * cos).to(dt).to(tl.float32) + (x1 * sin).to(dt).to(tl.float32)
    tl.store(p1, o1.to(dt), mask=mask)
    tl.store(p2, o2.to(dt), mask=mask)


@triton.jit
def _angles(
    pos_ptr, inv_freq_ptr, t, t_ok, stride_pos, SECTION: tl.constexpr, INTERLEAVED: tl.constexpr,
    MROPE: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """[BLOCK_T, BLOCK_HALF] fp32 angles of tokens t: position times inv_freq. RoPE reads positions [T];
    MRoPE [3, T] (rows T, H, W; row stride stride_pos), each frequency taking one row: SECTION gives the
    frequencies per axis, INTERLEAVED cycles T/H/W over them (Qwen3-VL, Qwen3.5), else they are chunks
    (Qwen2-VL)."""
    if MROPE:
        i = tl.arange(0, BLOCK_HALF)[None, :]
        pos_t = tl.load(pos_ptr + t, mask=t_ok, other=0).to(tl.float32)[:, None]
        pos_h = tl.load(pos_ptr + stride_pos + t, mask=t_ok, other=0).to(tl.float32)[:, None]
        pos_w = tl.load(pos_ptr + 2 * stride_pos + t, mask=t_ok, other=0).to(tl.float32)[:, None]
        # Which position row turns frequency i: a compile-time pattern over i, shared by every token.
        if INTERLEAVED:
            use_h = (i % 3 == 1) & (i < 3 * SECTION[1])
            use_w = (i % 3 == 2) & (i < 3 * SECTION[2])
        else:
            use_h = (i >= SECTION[0]) & (i < SECTION[0] + SECTION[1])
            use_w = i >= SECTION[0] + SECTION[1]
        pos = tl.where(use_h, pos_h, tl.where(use_w, pos_w, pos_t))  # [BLOCK_T, BLOCK_HALF]
        angle = pos * tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0)
    else:
        i = tl.arange(0, BLOCK_HALF)
        inv_freq = tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0)
        pos = tl.load(pos_ptr + t, mask=t_ok, other=0).to(tl.float32)
        angle = pos[:, None] * inv_freq[None, :]
    return angle


@triton.jit
def _rotary_kernel(
    pos_ptr,
    q,
    k,
    inv_freq_ptr,
    num_tokens,
    stride_pos,
    scaling,
    SECTION: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    MROPE: tl.constexpr,
    NEOX: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """q, k: packs.HeadRows, turned in place by _angles' angles (RoPE and MRoPE differ only there)."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < num_tokens
    angle = _angles(pos_ptr, inv_freq_ptr, t, t_ok, stride_pos, SECTION, INTERLEAVED, MROPE, HALF, BLOCK_HALF)
    cos = (tl.cos(angle) * scaling)[:, None, :]
    sin = (tl.sin(angle) * scaling)[:, None, :]
    t3, ok3 = t[:, None, None], t_ok[:, None, None]
    _rotate(q, t3, ok3, cos, sin, NEOX, HALF, BLOCK_QH, BLOCK_HALF)
    _rotate(k, t3, ok3, cos, sin, NEOX, HALF, BLOCK_KH, BLOCK_HALF)


def launch_rotation(
    positions, q, k, inv_freq, *, rotary_dim: int, scaling: float, section=None, interleaved=False, neox=True
):
    """_rotary_kernel over q and k's tokens: MRoPE when section is given (positions [3, T]), else RoPE
    (positions [T]); tiles from rotary_tiles."""
    half = rotary_dim // 2
    block_qh, block_kh, block_half, block_t, warps = rotary_tiles(q.shape[1], k.shape[1], half)
    stride_pos = positions.stride(0) if section is not None else 0
    _rotary_kernel[(triton.cdiv(q.shape[0], block_t),)](
        positions, head_rows(q), head_rows(k), inv_freq, q.shape[0], stride_pos, scaling,
        SECTION=tuple(section or (0, 0, 0)), INTERLEAVED=interleaved, MROPE=section is not None, NEOX=neox,
        HALF=half, BLOCK_QH=block_qh, BLOCK_KH=block_kh, BLOCK_HALF=block_half, BLOCK_T=block_t,
        num_warps=warps, **ROUNDED_AS_TRANSFORMERS,
    )  # fmt: skip


def apply_rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    rotary_dim: int,
    scaling: float = 1.0,
    neox: bool = True,
    backend: Backend | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place (first rotary_dim dims); returns (q, k).

    positions: [T] int; inv_freq: [rotary_dim / 2] fp32 (default, llama3, yarn, linear or dynamic rates,
    computed by the caller); scaling multiplies cos and sin. neox: rotate-half pairs, else GPT-J's
    adjacent pairs. q and k may be strided views (unit last stride), e.g. slices of one qkv projection.
    """
    check_rotation(q, k, rotary_dim, inv_freq)
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions must be [T={q.shape[0]}], got {tuple(positions.shape)}")
    if resolve_backend(backend, q.device) is Backend.TORCH:
        rq, rk = apply_rotary_ref(
            positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=scaling, neox=neox
        )
        return q.copy_(rq), k.copy_(rk)
    if q.shape[0]:
        launch_rotation(positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=scaling, neox=neox)
    return q, k
