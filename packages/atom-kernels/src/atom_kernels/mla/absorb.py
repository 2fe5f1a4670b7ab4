"""The absorbed MLA frontend's two per-head products for decode's few tokens, in Triton with PDL.

Absorbed attention multiplies each head's query by W_UK (q_latent = q_nope @ W_UK[h], [nope] x [nope, R])
before the latent attention and its output by W_UV (W_UV[h] @ o, [v, R] x [R]) after it. As cuBLAS
batched GEMMs those are two launches a layer outside the PDL chain, plus a concatenation of q_latent
with the rotated q_pe; at a few tokens each is a weight read of H * nope * R (or v * R) values, so a
GEMV-shaped kernel streams it and writes the concatenated query in the same pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend

# Up to this many tokens the frontend's products run here (absorb_output's programs re-read their weight
# block per token from L2; absorb_query's keep theirs in registers); past it they are GEMMs with reuse to
# gain, and cuBLAS's tiles take them. The kernels' token offsets are int32 within this bound.
MAX_ABSORB_TOKENS = 8
_BLOCK_R = 64  # latent columns a program (R = 512: 8 programs a head)
_BLOCK_V = 16  # output rows a program (v = 128: 8 programs a head)


@triton.jit
def _absorb_query_kernel(
    q_ptr,
    pe_ptr,
    w_ptr,
    out_ptr,
    tokens,
    stride_qt,
    stride_qh,
    stride_pt,
    stride_ph,
    stride_wh,
    stride_wn,
    stride_ot,
    stride_oh,
    NOPE: tl.constexpr,
    ROPE: tl.constexpr,
    R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    head = tl.program_id(0)
    rb = tl.program_id(1)
    n = tl.arange(0, BLOCK_N)
    r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    n_ok, r_ok = n < NOPE, r < R
    # the weight does not depend on the previous kernel: its load runs ahead of the wait
    w_ptrs = w_ptr + head * stride_wh + n[:, None] * stride_wn + r[None, :]
    w = tl.load(w_ptrs, mask=n_ok[:, None] & r_ok[None, :], other=0.0).to(tl.float32)  # [BN, BR]
    wait_for_inputs(PDL)
    p = tl.arange(0, BLOCK_P)
    for t in range(tokens):  # at most MAX_ABSORB_TOKENS: int32 offsets
        qn = tl.load(q_ptr + t * stride_qt + head * stride_qh + n, mask=n_ok, other=0.0).to(tl.float32)
        acc = tl.sum(qn[:, None] * w, axis=0)  # [BR]
        row = out_ptr + t * stride_ot + head * stride_oh
        tl.store(row + r, acc.to(out_ptr.dtype.element_ty), mask=r_ok)
        if rb == 0:  # the rotated q_pe after the latent columns
            pe = tl.load(pe_ptr + t * stride_pt + head * stride_ph + p, mask=p < ROPE)
            tl.store(row + R + p, pe, mask=p < ROPE)


@triton.jit
def _absorb_output_kernel(
    o_ptr,
    w_ptr,
    out_ptr,
    tokens,
    stride_ot,
    stride_oh,
    stride_wh,
    stride_wv,
    stride_yt,
    stride_yh,
    R: tl.constexpr,
    V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    head = tl.program_id(0)
    vb = tl.program_id(1)
    v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = v < V
    k = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + head * stride_wh + v[:, None] * stride_wv
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    for t in range(tokens):  # at most MAX_ABSORB_TOKENS: int32 offsets
        o_row = o_ptr + t * stride_ot + head * stride_oh
        acc = tl.zeros([BLOCK_V], dtype=tl.float32)
        for k0 in tl.static_range(0, R, BLOCK_K):
            k_ok = k0 + k < R
            w = tl.load(w_rows + (k0 + k)[None, :], mask=v_ok[:, None] & k_ok[None, :], other=0.0)
            o = tl.load(o_row + k0 + k, mask=k_ok, other=0.0).to(tl.float32)
            acc += tl.sum(w.to(tl.float32) * o[None, :], axis=1)  # [BV]
        tl.store(out_ptr + t * stride_yt + head * stride_yh + v, acc.to(out_ptr.dtype.element_ty), mask=v_ok)


def _check(op: str, tensors: dict[str, torch.Tensor], dims: int, tokens_of: torch.Tensor) -> None:
    """Each tensor has `dims` dimensions, a contiguous last one and the first's dtype; at most
    MAX_ABSORB_TOKENS tokens (tokens_of's first dimension)."""
    dtype = next(iter(tensors.values())).dtype
    for name, t in tensors.items():
        if t.dim() != dims:
            raise ValueError(f"{op} expects {name} of {dims} dimensions, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(
                f"{op} needs {name}'s last dimension contiguous, got strides {tuple(t.stride())}"
            )
        if t.dtype != dtype:
            raise ValueError(f"{op} expects one dtype, got {name} in {t.dtype} beside {dtype}")
    if tokens_of.shape[0] > MAX_ABSORB_TOKENS:
        raise ValueError(
            f"{op} takes at most MAX_ABSORB_TOKENS={MAX_ABSORB_TOKENS} tokens (more are a GEMM's: torch.bmm), "
            f"got {tokens_of.shape[0]}"
        )


def absorb_query(
    q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk: torch.Tensor, *, backend: Backend | str | None = None
) -> torch.Tensor:
    """q_nope [T, H, nope], q_pe [T, H, P] (views of the projected query are fine), w_uk [H, nope, R]
    (kv_b_proj's W_UK per head) -> [T, H, R + P] in q's dtype: [q_nope[t, h] @ w_uk[h] | q_pe[t, h]],
    the products accumulated in fp32 and rounded once; T <= MAX_ABSORB_TOKENS, one dtype. The torch
    backend: torch.bmm and torch.cat."""
    _check("absorb_query", {"q_nope": q_nope, "q_pe": q_pe, "w_uk": w_uk}, 3, q_nope)
    tokens, heads, nope = q_nope.shape
    rope, rank = q_pe.shape[2], w_uk.shape[2]
    if q_pe.shape[:2] != (tokens, heads) or tuple(w_uk.shape[:2]) != (heads, nope):
        raise ValueError(
            f"absorb_query expects q_nope [T, H, nope], q_pe [T, H, P], w_uk [H, nope, R]; got "
            f"{tuple(q_nope.shape)}, {tuple(q_pe.shape)}, {tuple(w_uk.shape)}"
        )
    if resolve_backend(backend, q_nope.device) is Backend.TORCH:
        latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
        return torch.cat([latent, q_pe], dim=-1)
    out = torch.empty(tokens, heads, rank + rope, dtype=q_nope.dtype, device=q_nope.device)
    if tokens == 0:
        return out
    pdl = pdl_launch(q_nope.device)
    _absorb_query_kernel[(heads, triton.cdiv(rank, _BLOCK_R))](
        q_nope, q_pe, w_uk, out, tokens, q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
        w_uk.stride(0), w_uk.stride(1), out.stride(0), out.stride(1), NOPE=nope, ROPE=rope, R=rank,
        BLOCK_N=triton.next_power_of_2(nope), BLOCK_R=_BLOCK_R, BLOCK_P=triton.next_power_of_2(rope),
        PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
    return out


def absorb_output(
    o: torch.Tensor, w_uv: torch.Tensor, *, backend: Backend | str | None = None
) -> torch.Tensor:
    """o [T, H, R] (the latent attention's output), w_uv [H, v, R] (kv_b_proj's W_UV per head) ->
    [T, H, v] in o's dtype: w_uv[h] @ o[t, h], accumulated in fp32 and rounded once; T <=
    MAX_ABSORB_TOKENS, one dtype. The torch backend: torch.bmm."""
    _check("absorb_output", {"o": o, "w_uv": w_uv}, 3, o)
    tokens, heads, rank = o.shape
    v_dim = w_uv.shape[1]
    if tuple(w_uv.shape) != (heads, v_dim, rank):
        raise ValueError(
            f"absorb_output expects o [T, H, R] and w_uv [H, v, R]; got {tuple(o.shape)}, {tuple(w_uv.shape)}"
        )
    block_k = min(128, triton.next_power_of_2(rank))
    if resolve_backend(backend, o.device) is Backend.TORCH:
        return torch.bmm(o.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1).contiguous()
    out = torch.empty(tokens, heads, v_dim, dtype=o.dtype, device=o.device)
    if tokens == 0:
        return out
    pdl = pdl_launch(o.device)
    _absorb_output_kernel[(heads, triton.cdiv(v_dim, _BLOCK_V))](
        o, w_uv, out, tokens, o.stride(0), o.stride(1), w_uv.stride(0), w_uv.stride(1), out.stride(0),
        out.stride(1), R=rank, V=v_dim, BLOCK_V=_BLOCK_V, BLOCK_K=block_k, PDL=pdl, num_warps=4,
        launch_pdl=pdl,
    )  # fmt: skip
    return out
