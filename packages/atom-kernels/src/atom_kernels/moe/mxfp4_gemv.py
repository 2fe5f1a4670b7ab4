"""One token's MXFP4 expert GEMMs as GEMVs: each program streams a slab of one expert's bytes once.

A single token gives each of its k experts one row, so the product is a matrix-vector one and the cost is
the conversion of every e2m1 value on its way from the bytes to the multiply. Triton's scaled dot spends
a dozen instructions a value there (upcast, scale, a layout change for the MMA). Here a value costs about
four: a few bit operations per pair of values, which place the nibble's magnitude bits on fp16's
mantissa top bit and two low exponent bits (so the fp16 holds e2m1 * 2**-14 exactly, code 1 as fp16's
subnormal 2**-15) and its sign on the sign bit; one conversion to fp32, exact; one FMA. The e8m0 scale
multiplies each 32-value group's partial sum once, together with the 2**14. On the GPU the bit operations
are inline PTX, four bytes (eight values) at a time; Triton's CPU interpreter runs an equivalent built
from Triton's own integer ops.

Layout as the scaled-dot kernel's (expert_gemm.py): bytes [E, N, K / 2] (low nibble first along K) and
scales [E, N, K / 32]; rows are pairs in order_one_token's layout with one row a tile (block_m 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.moe.expert_gemm import Activations, Epilogue, ExpertWeights, PairRows, _e2m1_times_scale
from atom_kernels.moe.expert_mlp import SILU, ExpertActivation, ExpertBiases
from atom_kernels.moe.mxfp4 import ExpertMxfp4
from atom_kernels.settings import SETTINGS

# Two to the power the fp16 values carry (e2m1 * 2**-FP16_SHIFT), undone in the group scale's exponent
FP16_SHIFT = 14


@triton.jit
def _e2m1_fp16_ptx(packed):
    """packed uint8 -> (low-nibble values, high-nibble values), fp16 e2m1 * 2**-14. Four bytes an
    instance: prmt puts bytes 0 and 1 (2 and 3) in the two halves' nibble positions, then per pair of
    values a shift for the magnitude bits, one for the sign, and their masked merge."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 s, a, b;
        prmt.b32 s, $4, 0, 0x3120;
        shl.b32 a, s, 9;  shl.b32 b, s, 12; and.b32 a, a, 0x0E000E00; lop3.b32 $0, a, b, 0x80008000, 0xF8;
        shl.b32 a, s, 1;  shl.b32 b, s, 4;  and.b32 a, a, 0x0E000E00; lop3.b32 $1, a, b, 0x80008000, 0xF8;
        shl.b32 a, s, 5;  shl.b32 b, s, 8;  and.b32 a, a, 0x0E000E00; lop3.b32 $2, a, b, 0x80008000, 0xF8;
        shr.b32 a, s, 3;  and.b32 a, a, 0x0E000E00; lop3.b32 $3, a, s, 0x80008000, 0xF8;
        }""",
        constraints="=r,=r,=r,=r,r",
        args=[packed],
        dtype=(tl.float16, tl.float16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _e2m1_halves(packed, PTX: tl.constexpr):
    """packed uint8 [...] -> (low-nibble values, high-nibble values) in fp32, each e2m1 * 2**-14."""
    if PTX:
        lo, hi = _e2m1_fp16_ptx(packed)
        return lo.to(tl.float32), hi.to(tl.float32)
    code = packed.to(tl.int32)
    return (
        _e2m1_times_scale(code & 15, 127 - 14, tl.float32),
        _e2m1_times_scale(code >> 4, 127 - 14, tl.float32),
    )


@triton.jit
def _gemv_step(x_even, x_odd, w_ptrs, s_ptrs, ok, PTX: tl.constexpr):
    """One k-step's partial products [BN] of x (even and odd columns [G, 16], fp32) with an expert's bytes
    [BN, G, 16] and group scales [BN, G] at w_ptrs / s_ptrs (groups past K masked by ok [G])."""
    packed = tl.load(w_ptrs, mask=ok[None, :, None], other=0)
    exponent = tl.load(s_ptrs, mask=ok[None, :], other=0).to(tl.int32)
    lo, hi = _e2m1_halves(packed, PTX)
    groups = tl.sum(lo * x_even[None, :, :] + hi * x_odd[None, :, :], axis=2)  # [BN, G]
    scale = ((exponent + 14) << 23).to(tl.float32, bitcast=True)  # 2**(e8m0 - 127 + 14), exact in fp32
    return tl.sum(groups * scale, axis=1)


@triton.jit
def _mxfp4_gemv_kernel(
    act,
    wts,
    pairs,
    epi,
    out_ptr,
    stride_om,
    N,
    K,
    GATED: tl.constexpr,
    WEIGHTED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,  # expert_mlp.ExpertActivation.code: 0 silu, 1 swiglu_oai
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PTX: tl.constexpr,
):
    """act: expert_gemm.Activations (x [T, K] for gate/up, the intermediate [pairs, K] for down);
    wts: expert_gemm.ExpertWeights (bytes, scales); pairs: expert_gemm.PairRows in order_one_token's
    layout (tile_expert = each pair's expert); epi: expert_gemm.Epilogue. Program: one pair, BLOCK_N
    output columns (gate/up: those of the gate half and the same of the up half). out [pairs, N]."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    pair = tl.program_id(0) // tiles_n
    pid_n = tl.program_id(0) % tiles_n
    expert = tl.load(pairs.tile_expert + pair).to(tl.int64)
    a_row = (pair // pairs.top_k) if GATED else pair
    G: tl.constexpr = BLOCK_K // 32
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    rows = tl.where(col_ok, cols, 0).to(tl.int64)  # masked columns read row 0: no load is masked by column
    g = tl.arange(0, G)
    b = tl.arange(0, 16)
    w_ptrs = wts.w + expert * wts.stride_we + rows[:, None, None] * wts.stride_wn + (g * 16)[None, :, None]
    w_ptrs += b[None, None, :]
    s_ptrs = wts.scale + expert * wts.stride_se + rows[:, None] * wts.stride_sn + g[None, :]
    x_ptrs = act.a + a_row.to(tl.int64) * act.stride_am + (g * 32)[:, None] + 2 * b[None, :]
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ok = g * 32 < K - k0  # K is whole groups of 32: a last partial k-step is masked by group
        x_even = tl.load(x_ptrs + k0, mask=ok[:, None], other=0.0).to(tl.float32)
        x_odd = tl.load(x_ptrs + k0 + 1, mask=ok[:, None], other=0.0).to(tl.float32)
        acc += _gemv_step(x_even, x_odd, w_ptrs + k0 // 2, s_ptrs + k0 // 32, ok, PTX)
        if GATED:  # the up half of w13 sits N rows below the gate half
            acc_up += _gemv_step(
                x_even,
                x_odd,
                w_ptrs + N * wts.stride_wn + k0 // 2,
                s_ptrs + N * wts.stride_sn + k0 // 32,
                ok,
                PTX,
            )
    if HAS_BIAS:  # the up half's biases sit N columns after the gate half's
        b_ptrs = epi.bias + expert * epi.stride_be + cols
        acc += tl.load(b_ptrs, mask=col_ok, other=0.0).to(tl.float32)
        if GATED:
            acc_up += tl.load(b_ptrs + N, mask=col_ok, other=0.0).to(tl.float32)
    if GATED:
        if ACT == 1:  # swiglu_oai: (clamp(up, -l, l) + 1) * g * sigmoid(alpha * g), g = min(gate, l)
            gate = tl.minimum(acc, epi.limit)
            up = tl.minimum(tl.maximum(acc_up, -epi.limit), epi.limit)
            acc = gate / (1.0 + tl.exp(-epi.alpha * gate)) * (up + 1.0)
        else:
            acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc = acc * tl.load(pairs.pair_weight + pair)
    out_ptrs = out_ptr + pair.to(tl.int64) * stride_om + cols
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


@dataclass(frozen=True, slots=True)
class GemvConfig:
    """Output columns a program takes, values a k-step reads (whole 32-value groups), warps."""

    block_n: int
    block_k: int
    num_warps: int


def gemv_config(*, interpret: bool = False) -> GemvConfig:
    """benchmarks/sweep_moe_mxfp4.py's choice at gpt-oss's experts; small steps under the interpreter."""
    if interpret:
        return GemvConfig(16, 64, 1)
    return GemvConfig(32, 256, 4)


def _launch(a, w, scale, out, pairs: PairRows, n, k, cfg: GemvConfig, *, gated, weighted, bias, activation):
    weights = ExpertWeights(w, scale, w.stride(0), w.stride(1), scale.stride(0), scale.stride(1))
    epi = Epilogue(
        bias if bias is not None else a,  # never read without HAS_BIAS
        0 if bias is None else bias.stride(0),
        float(activation.alpha),
        float(activation.limit),
    )
    grid = (pairs.num_pairs * triton.cdiv(n, cfg.block_n),)
    _mxfp4_gemv_kernel[grid](
        Activations(a, a, a.stride(0), 0), weights, pairs, epi, out, out.stride(0), n, k,
        GATED=gated, WEIGHTED=weighted, HAS_BIAS=bias is not None, ACT=activation.code,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PTX=not SETTINGS.triton_interpret, num_warps=cfg.num_warps,
    )  # fmt: skip


def one_token_mxfp4_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_ids: torch.Tensor,
    pair_weights: torch.Tensor,
    mxfp4: ExpertMxfp4,
    cfg: GemvConfig,
    *,
    biases: ExpertBiases | None = None,
    activation: ExpertActivation = SILU,
) -> torch.Tensor:
    """x [1, H]; w13 [E, 2I, H / 2] and w2 [E, H, I / 2] MXFP4 bytes with mxfp4's scales; topk_ids [1, k]
    (distinct experts); pair_weights [k] fp32 -> [k, H]: each pair's expert output times its weight, for
    combine_topk to sum. Two launches, no ordering: pair j's row is j."""
    ids = topk_ids.reshape(-1)
    ids = ids if ids.is_contiguous() else ids.contiguous()
    top_k = ids.numel()
    inter, hidden = w13.shape[1] // 2, x.shape[1]
    pairs = PairRows(ids, ids, ids, pair_weights, top_k, top_k)  # sorted_pairs, num_padded: unread
    h = torch.empty(top_k, inter, dtype=x.dtype, device=x.device)
    _launch(
        x, w13, mxfp4.w13, h, pairs, inter, hidden, cfg, gated=True, weighted=False,
        bias=None if biases is None else biases.w13, activation=activation,
    )  # fmt: skip
    y = torch.empty(top_k, w2.shape[1], dtype=x.dtype, device=x.device)
    _launch(
        h, w2, mxfp4.w2, y, pairs._replace(top_k=1), w2.shape[1], inter, cfg, gated=False, weighted=True,
        bias=None if biases is None else biases.w2, activation=SILU,
    )  # fmt: skip
    return y
