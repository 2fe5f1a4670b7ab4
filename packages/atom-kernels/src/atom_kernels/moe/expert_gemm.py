"""The grouped GEMM of fused MoE: tiles of rows that all belong to one expert, times that expert's weights.

Rows come in `ExpertOrder` (align.py), so each block_m-row tile reads one expert's weight tile once for
all of its rows. Two uses, chosen at compile time:
- gate/up: rows gather x by token, multiply the gate and the up halves of w13 together, and store
  silu(gate) * up at the row's sorted position (no [pairs, 2I] intermediate in memory);
- down: rows read that intermediate contiguously, scale by the pair's routing weight in fp32, and store
  at the pair's own row, for the combine over k to sum.
Weights are in the activations' dtype, or e4m3 with block scales (fp8 checkpoints). With e4m3 weights the
activations are either in their dtype (weight-only: each weight tile is multiplied by its scales as it is
loaded and the product runs in the activations' dtype) or e4m3 too, quantized per row and block_k group
(W8A8: both tiles go to the MMA as loaded and each k-step's fp32 product is scaled by the rows' and the
columns' scales, as the dense W8A8 GEMM does; no per-element conversion).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from atom_kernels.moe.align import ExpertOrder
from atom_kernels.moe.expert_mlp import SILU, ExpertActivation
from atom_kernels.moe.mxfp4 import GROUP as MXFP4_GROUP
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.tile_order import grouped_tile

MXFP4 = "mxfp4"  # scales=(scale, MXFP4): the weights are MXFP4 bytes


def mxfp4_block_k(block_k: int, k: int) -> int:
    """The largest k-step up to block_k (and at least one 32-value group) whose tiles divide K: MXFP4
    tiles are unpacked whole, never masked."""
    step = max(block_k, MXFP4_GROUP)
    while k % step:
        step //= 2
    return step


@dataclass(frozen=True, slots=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


def tile_config(
    num_pairs: int,
    num_experts: int,
    itemsize: int = 2,
    *,
    interpret: bool = False,
    one_token: bool = False,
) -> TileConfig:
    """Tile shape from the mean rows per expert, known on the host without a sync (tuned for bf16 by
    benchmarks/bench_moe.py's sweep, decode's few tokens by sweep_moe_decode.py's).

    Few rows per expert (decode): the step streams expert weights, so short tiles waste the fewest
    padded rows, and narrow n-tiles give a handful of pairs enough programs to load with every SM; one
    token's k tiles (one_token: align.order_one_token's layout) stream best 64 columns wide (DeepSeek-V3's
    and Qwen3-30B-A3B's experts; at 4 tokens the 32-wide tiles stay ahead). Many rows: taller tiles reuse each weight tile. fp32
    (itemsize 4) has no tensor-core path for exact products, so it takes small tiles that neither spill
    registers nor overflow shared memory.
    """
    if interpret:  # the CPU interpreter: small tiles keep the numpy emulation quick
        return TileConfig(16, 32, 32, group_m=2, num_warps=1, num_stages=1)
    if itemsize >= 4:
        return TileConfig(32, 32, 32, num_warps=4, num_stages=2)
    per_expert = num_pairs / num_experts
    if per_expert <= 8:
        wide = one_token or num_pairs >= 64
        return TileConfig(16, 64 if wide else 32, 128, num_warps=4, num_stages=4)
    if per_expert <= 32:
        return TileConfig(32, 64, 128, num_warps=4, num_stages=4)
    if per_expert <= 96:
        return TileConfig(64, 64, 64, num_warps=4, num_stages=4)
    return TileConfig(128, 128, 64, num_warps=8, num_stages=3)


def down_tile_config(gate_up_config: TileConfig) -> TileConfig:
    """The down GEMM keeps the ordering's row tiles (block_m) but has one accumulator where gate/up has
    two: with tall tiles it takes twice the width (benchmarks/bench_moe.py's sweep chose it).
    """
    if gate_up_config.block_m >= 128:
        return TileConfig(gate_up_config.block_m, 256, 64, num_warps=8, num_stages=3)
    return gate_up_config


@triton.jit
def _load_weight(w_ptrs, ws_ptrs, mask, col_ok, dtype, FP8_W: tl.constexpr):
    """A [BLOCK_K, BLOCK_N] weight tile in the activations' dtype; e4m3 tiles are multiplied by their
    columns' block scales first (one scale per column within a k-step: BLOCK_K divides the scale block)."""
    w = tl.load(w_ptrs, mask=mask, other=0.0)
    if FP8_W:
        w = (w.to(tl.float32) * tl.load(ws_ptrs, mask=col_ok[None, :], other=0.0)).to(dtype)
    return w


@triton.jit
def _e2m1_times_scale(code, exponent, dtype):
    """e2m1 codes (int32: sign bit, two exponent bits, one mantissa bit) times 2**(exponent - 127) (the
    e8m0 scale bytes, int32, broadcast against them) -> dtype, built from fp32's bits: the e2m1 exponent
    plus the scale's lands in the exponent field and the mantissa bit in the top mantissa bit, so no float
    arithmetic runs before the one conversion to dtype (exact: e2m1 times a power of two fits bf16). For
    the e8m0 bytes real checkpoints hold (2**-100 .. 2**100: no fp32 underflow)."""
    e = (code >> 1) & 3
    base = tl.where(e == 0, 126, e + 126) + exponent - 127  # 0.5 * 2**0 for e = 0 (code 1): exponent 126
    mantissa = tl.where(e == 0, 0, code & 1)
    zero = (code & 7) == 0
    bits = ((code & 8) << 28) | tl.where(zero, 0, (base << 23) | (mantissa << 22))
    return bits.to(tl.float32, bitcast=True).to(dtype)


@triton.jit
def _mxfp4_halves(w_ptrs, ws_ptrs, col_ok, dtype, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """An MXFP4 k-step: bytes [BK / 2, BN] and e8m0 scales from ws_ptrs [1, BN] (its first 32-value group;
    the next follow) -> (the even-k values, the odd-k values), each [BK / 2, BN] in dtype: byte r holds
    k = 2r in its low nibble and 2r + 1 in its high one, and byte rows r // 16 share a scale. Kept apart
    (the caller multiplies them with a's even and odd columns), they need no interleaving shuffle."""
    packed = tl.load(w_ptrs, mask=col_ok[None, :], other=0).to(tl.int32)
    packed = tl.reshape(packed, (BLOCK_K // 32, 16, BLOCK_N))
    exponent = tl.load(ws_ptrs + tl.arange(0, BLOCK_K // 32)[:, None], mask=col_ok[None, :], other=127)
    exponent = exponent.to(tl.int32)[:, None, :]
    lo = _e2m1_times_scale(packed & 15, exponent, dtype)
    hi = _e2m1_times_scale(packed >> 4, exponent, dtype)
    return tl.reshape(lo, (BLOCK_K // 2, BLOCK_N)), tl.reshape(hi, (BLOCK_K // 2, BLOCK_N))


@triton.jit
def _mxfp4_step(
    acc,
    a_even,
    a_odd,
    w_ptrs,
    ws_ptrs,
    col_ok,
    PRECISION: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """acc + a @ w for one MXFP4 k-step: a's even columns times the low nibbles, its odd ones times the
    high nibbles."""
    lo, hi = _mxfp4_halves(w_ptrs, ws_ptrs, col_ok, a_even.dtype, BLOCK_K, BLOCK_N)
    acc = tl.dot(a_even, lo, acc, input_precision=PRECISION)
    return tl.dot(a_odd, hi, acc, input_precision=PRECISION)


@triton.jit
def _mxfp4_dot(acc, a, w_ptrs, mx_ptrs, bytes_ok, groups_ok, A_FORMAT: tl.constexpr):
    """acc + a @ w for one MXFP4 k-step through tl.dot_scaled: a [BM, BK] (bf16 or fp16), the bytes
    [BK / 2, BN] (two k a byte, low nibble first, as the scaled dot packs e2m1 along K) and their e8m0
    scales [BN, BK / 32], each under its mask (masked bytes are zeros). fast_math: real checkpoints hold
    no NaN scale (0xFF), so its checks are skipped."""
    packed = tl.load(w_ptrs, mask=bytes_ok, other=0)
    scale = tl.load(mx_ptrs, mask=groups_ok, other=127)
    return tl.dot_scaled(a, None, A_FORMAT, packed, scale, "e2m1", acc, fast_math=True)


@triton.jit
def gated_activation(gate, up, epi, ACT: tl.constexpr):
    """The gate/up GEMM's epilogue on its fp32 sums: ACT 0 silu(gate) * up; ACT 1 swiglu_oai,
    (clamp(up, -l, l) + 1) * g * sigmoid(alpha * g) with g = min(gate, l) (epi: Epilogue's alpha, limit)."""
    if ACT == 1:
        g = tl.minimum(gate, epi.limit)
        return g / (1.0 + tl.exp(-epi.alpha * g)) * (tl.minimum(tl.maximum(up, -epi.limit), epi.limit) + 1.0)
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _w8a8_step(a, w_ptrs, ws_ptrs, a_s, mask, col_ok):
    """One k-step of the W8A8 product: e4m3 a [BM, BK] @ e4m3 w [BK, BN], scaled in fp32 by the rows'
    activation scales a_s [BM] and the columns' weight scales."""
    w = tl.load(w_ptrs, mask=mask, other=0.0)
    w_s = tl.load(ws_ptrs, mask=col_ok[None, :], other=0.0)
    return tl.dot(a, w) * a_s[:, None] * w_s


class Activations(NamedTuple):
    """The GEMM's left operand a [rows, K] and, for W8A8, its e4m3 group scales [rows, K / SCALE_K]."""

    a: torch.Tensor
    scale: torch.Tensor  # unread without FP8_A
    stride_am: int
    stride_as: int


class ExpertWeights(NamedTuple):
    """Experts' weights [E, N (x2 gated), K] and, for e4m3 ones, their block scales [E, N_blocks, K_blocks]."""

    w: torch.Tensor
    scale: torch.Tensor  # unread without FP8_W
    stride_we: int
    stride_wn: int
    stride_se: int
    stride_sn: int


class Epilogue(NamedTuple):
    """What follows the product: biases [E, N (x2 gated)] (any float dtype; unread without HAS_BIAS) and the
    swiglu_oai activation's alpha and limit (unread with ACT 0, silu)."""

    bias: torch.Tensor
    stride_be: int
    alpha: float
    limit: float


class PairRows(NamedTuple):
    """Which (token, expert) pair each row computes: the ordering (align.ExpertOrder) and routing weights."""

    sorted_pairs: torch.Tensor  # unread with PAIR_TILES
    tile_expert: torch.Tensor
    num_padded: torch.Tensor  # unread with PAIR_TILES
    pair_weight: torch.Tensor  # unread without WEIGHTED
    num_pairs: int
    top_k: int


# Constexprs that follow from the others: gate/up gathers a's rows by token; exact fp32 products for fp32.
_DERIVED = {
    "A_BY_TOKEN": lambda args: args["GATED"],
    "EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
    "W_K": lambda args: args["BLOCK_K"] // 2 if args["MXFP4_W"] else args["BLOCK_K"],
    "PRECISION": lambda args: "ieee" if args["act"].a.dtype == torch.float32 else "tf32",
    # MXFP4 tiles of bf16/fp16 activations go through Triton's scaled dot (the e2m1 upcast fused into the
    # MMA's operand path); fp32 ones (exact tests) through the unpacking below
    "MXFP4_DOT": lambda args: args["MXFP4_W"] and args["act"].a.dtype in _DOT_SCALED_FORMAT,
    "A_FORMAT": lambda args: _DOT_SCALED_FORMAT.get(args["act"].a.dtype, "bf16"),
}
_DOT_SCALED_FORMAT = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@triton.heuristics(_DERIVED)
@triton.jit
def _expert_gemm_kernel(
    act,
    wts,
    pairs,
    epi,
    out_ptr,
    stride_om,
    N,
    K,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    GATED: tl.constexpr,
    WEIGHTED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,  # expert_mlp.ExpertActivation.code: 0 silu, 1 swiglu_oai
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FP8_W: tl.constexpr,
    FP8_A: tl.constexpr,  # a is e4m3 with scales [rows, K / SCALE_K] (W8A8; needs FP8_W)
    MXFP4_W: tl.constexpr,  # w is MXFP4: bytes [E, N, K / 2], e8m0 scales [E, N, K / 32] (weight-only)
    PAIR_TILES: tl.constexpr,
    PDL: tl.constexpr,
    A_BY_TOKEN: tl.constexpr,
    EVEN_K: tl.constexpr,
    W_K: tl.constexpr,  # weight elements of storage a k-step reads along K (BLOCK_K / 2 for MXFP4 bytes)
    PRECISION: tl.constexpr,
    MXFP4_DOT: tl.constexpr,
    A_FORMAT: tl.constexpr,
):
    """act: Activations; wts: ExpertWeights; pairs: PairRows; epi: Epilogue; out [rows or pairs, N]. The
    last six constexprs follow from the rest (_DERIVED)."""
    # Every input but the weights comes from the kernels just before (routing, the ordering, gate/up), and
    # which weights is known only from them: nothing to read ahead of the wait. (A trigger after the K
    # loop instead of here measured no better at B=64, and slower at B=1.)
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_m = tl.num_programs(0) // tiles_n
    pid_m, pid_n = grouped_tile(pid, tiles_m, tiles_n, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if PAIR_TILES:  # one token: tile m is pair m, in its first row (align.order_one_token)
        pair = tl.where(rows == pid_m * BLOCK_M, pid_m, pairs.num_pairs)
    else:
        if pid_m * BLOCK_M >= tl.load(pairs.num_padded):
            return
        pair = tl.load(pairs.sorted_pairs + rows)
    expert = tl.load(pairs.tile_expert + pid_m).to(tl.int64)
    valid = pair < pairs.num_pairs
    a_row = (pair // pairs.top_k).to(tl.int64) if A_BY_TOKEN else rows.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    kw = tl.arange(0, W_K)
    a_ptrs = act.a + a_row[:, None] * act.stride_am + ks[None, :]
    a_ptrs_even = act.a + a_row[:, None] * act.stride_am + 2 * kw[None, :]  # MXFP4: a's even columns
    w_ptrs = (
        wts.w + expert * wts.stride_we + cols[None, :].to(tl.int64) * wts.stride_wn + kw[:, None]
    )  # [W_K, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ws_ptrs = (
        wts.scale + expert * wts.stride_se + (cols // SCALE_N)[None, :].to(tl.int64) * wts.stride_sn
    )  # [1, BN]
    up_rows = N // SCALE_N  # the up half's scale rows start here (N is a multiple of SCALE_N)
    if MXFP4_DOT:  # the scales as the scaled dot takes them: [BN, BK / 32], a k-step's groups along the row
        mx_ptrs = (
            wts.scale
            + expert * wts.stride_se
            + cols[:, None].to(tl.int64) * wts.stride_sn
            + tl.arange(0, BLOCK_K // 32)[None, :]
        )
    for k0 in range(0, K, BLOCK_K):
        if MXFP4_DOT:  # K is whole 32-value groups; a last partial k-step is masked by group
            k_ok = ks < K - k0
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            bytes_ok = (kw < (K - k0) // 2)[:, None] & col_ok[None, :]
            groups_ok = col_ok[:, None] & (tl.arange(0, BLOCK_K // 32) < (K - k0) // 32)[None, :]
            acc = _mxfp4_dot(acc, a, w_ptrs, mx_ptrs + k0 // 32, bytes_ok, groups_ok, A_FORMAT)
            if GATED:  # the up half of w13 sits N rows below the gate half
                acc_up = _mxfp4_dot(
                    acc_up,
                    a,
                    w_ptrs + N * wts.stride_wn,
                    mx_ptrs + N * wts.stride_sn + k0 // 32,
                    bytes_ok,
                    groups_ok,
                    A_FORMAT,
                )
        elif MXFP4_W:
            a_even = tl.load(a_ptrs_even, mask=valid[:, None], other=0.0)
            a_odd = tl.load(a_ptrs_even + 1, mask=valid[:, None], other=0.0)
            k_group = k0 // 32
            acc = _mxfp4_step(
                acc, a_even, a_odd, w_ptrs, ws_ptrs + k_group, col_ok, PRECISION, BLOCK_K, BLOCK_N
            )
            if GATED:  # the up half of w13 sits N rows below the gate half
                acc_up = _mxfp4_step(
                    acc_up,
                    a_even,
                    a_odd,
                    w_ptrs + N * wts.stride_wn,
                    ws_ptrs + N * wts.stride_sn + k_group,
                    col_ok,
                    PRECISION,
                    BLOCK_K,
                    BLOCK_N,
                )
            a_ptrs_even += BLOCK_K
        else:
            if EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                w_mask = col_ok[None, :]
            else:
                k_ok = ks < K - k0
                a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
                w_mask = k_ok[:, None] & col_ok[None, :]
            if FP8_A:
                a_s = tl.load(act.scale + a_row * act.stride_as + k0 // SCALE_K, mask=valid, other=0.0)
                acc += _w8a8_step(a, w_ptrs, ws_ptrs + k0 // SCALE_K, a_s, w_mask, col_ok)
                if GATED:  # the up half of w13 sits N rows below the gate half
                    acc_up += _w8a8_step(
                        a,
                        w_ptrs + N * wts.stride_wn,
                        ws_ptrs + up_rows * wts.stride_sn + k0 // SCALE_K,
                        a_s,
                        w_mask,
                        col_ok,
                    )
            else:
                w = _load_weight(w_ptrs, ws_ptrs + k0 // SCALE_K, w_mask, col_ok, a.dtype, FP8_W)
                acc = tl.dot(a, w, acc, input_precision=PRECISION)
                if GATED:  # the up half of w13 sits N rows below the gate half
                    w_up = _load_weight(
                        w_ptrs + N * wts.stride_wn,
                        ws_ptrs + up_rows * wts.stride_sn + k0 // SCALE_K,
                        w_mask,
                        col_ok,
                        a.dtype,
                        FP8_W,
                    )
                    acc_up = tl.dot(a, w_up, acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += W_K
    if HAS_BIAS:  # the up half's biases sit N columns after the gate half's
        b_ptrs = epi.bias + expert * epi.stride_be + cols
        acc += tl.load(b_ptrs, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(b_ptrs + N, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = gated_activation(acc, acc_up, epi, ACT)
    if WEIGHTED:
        acc = acc * tl.load(pairs.pair_weight + pair, mask=valid, other=0.0)[:, None]
    out_row = rows.to(tl.int64) if GATED else pair.to(tl.int64)
    out_ptrs = out_ptr + out_row[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


def _launch(
    a,
    w,
    out,
    order: ExpertOrder,
    pair_weights,
    n,
    k,
    top_k,
    cfg: TileConfig,
    *,
    gated: bool,
    scales=None,
    a_scale=None,
    bias: torch.Tensor | None = None,
    activation: ExpertActivation = SILU,
):
    """scales: None for weights in a's dtype, or (scale [E, N_blocks, K_blocks] fp32, (block_n, block_k))
    for e4m3 weights; then BLOCK_K is cut to divide block_k (one scale per column and k-step); or
    (scale uint8 [E, N, K / 32], MXFP4) for MXFP4 bytes w [E, N, K / 2]; then BLOCK_K is whole groups of
    32 (dividing K where fp32 activations unpack the tiles; bf16/fp16 ones mask a last partial k-step).
    a_scale: [rows of a, K_blocks] fp32 when a is e4m3 (W8A8; block_k a power of two >= 32).
    bias: [E, N (x2 gated)] added before the activation (gated) or the routing weight (down)."""
    tiles_m = order.capacity // cfg.block_m
    grid = (tiles_m * triton.cdiv(n, cfg.block_n),)
    block_k, scale, (scale_n, scale_k) = cfg.block_k, None, (1, 1)
    mxfp4 = scales is not None and scales[1] is MXFP4
    if mxfp4:
        scale, (scale_n, scale_k) = scales[0], (1, MXFP4_GROUP)
        # the scaled dot masks a last partial k-step by group; the unpacking path needs whole k-steps
        block_k = max(block_k, MXFP4_GROUP) if a.dtype in _DOT_SCALED_FORMAT else mxfp4_block_k(block_k, k)
    elif scales is not None:
        scale, (scale_n, scale_k) = scales
        block_k = min(block_k, scale_k)
    # Not for one token's tiles (order_one_token): launched early they made Qwen3-30B-A3B's B=1 decode
    # slower, where the ordered tiles of more tokens gain (B=64; atom-core
    # results/h200/profile_engine_step.jsonl#engine_step_moe_pdl_h200). Why was not isolated.
    pdl = pdl_launch(a.device) and not order.pair_tiles
    w_scale = scale if scales is not None else w  # never read without FP8_W
    act = Activations(a, w_scale, a.stride(0), 0)  # the scale is never read without FP8_A
    if a_scale is not None:
        act = Activations(a, a_scale, a.stride(0), a_scale.stride(0))
    weights = ExpertWeights(w, w_scale, w.stride(0), w.stride(1), w_scale.stride(0), w_scale.stride(1))
    pairs = PairRows(
        order.tile_expert if order.pair_tiles else order.sorted_pairs,
        order.tile_expert,
        order.tile_expert if order.pair_tiles else order.num_padded,
        pair_weights if pair_weights is not None else a,
        order.num_pairs,
        top_k,
    )
    epi = Epilogue(
        bias if bias is not None else a,  # never read without HAS_BIAS
        0 if bias is None else bias.stride(0),
        float(activation.alpha),
        float(activation.limit),
    )
    _expert_gemm_kernel[grid](
        act, weights, pairs, epi, out, out.stride(0), n, k, SCALE_N=scale_n, SCALE_K=scale_k, GATED=gated,
        WEIGHTED=pair_weights is not None, HAS_BIAS=bias is not None, ACT=activation.code,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
        GROUP_M=cfg.group_m, FP8_W=scales is not None and not mxfp4, FP8_A=a_scale is not None, MXFP4_W=mxfp4,
        PAIR_TILES=order.pair_tiles,
        PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip


def gate_up(
    x: torch.Tensor,
    w13: torch.Tensor,
    order: ExpertOrder,
    top_k: int,
    cfg: TileConfig,
    scales=None,
    *,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
    activation: ExpertActivation = SILU,
) -> torch.Tensor:
    """x: [T, H], w13: [E, 2I, H] -> [capacity, I]: act(gate, up) (silu(gate) * up unless `activation` says
    otherwise) at each pair's sorted row (padding unset); bias [E, 2I] added to gate and up first.
    x_scale: x is e4m3 with these per-token group scales (W8A8); out_dtype: then the output's dtype."""
    inter = w13.shape[1] // 2
    dtype = out_dtype or x.dtype
    out = torch.empty(order.capacity, inter, dtype=dtype, device=x.device)
    _launch(
        x, w13, out, order, None, inter, x.shape[1], top_k, cfg, gated=True, scales=scales, a_scale=x_scale,
        bias=bias, activation=activation,
    )  # fmt: skip
    return out


def down(
    h: torch.Tensor,
    w2: torch.Tensor,
    order: ExpertOrder,
    pair_weights: torch.Tensor,
    cfg: TileConfig,
    scales=None,
    *,
    h_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """h: [capacity, I] (gate_up's), w2: [E, H, I], pair_weights: [pairs] fp32 -> [pairs, H], weighted
    (after bias [E, H], if given, is added). h_scale: h is e4m3 with these per-row group scales (W8A8);
    out_dtype: then the output's dtype."""
    out = torch.empty(order.num_pairs, w2.shape[1], dtype=out_dtype or h.dtype, device=h.device)
    _launch(
        h,
        w2,
        out,
        order,
        pair_weights,
        w2.shape[1],
        h.shape[1],  # I (w2 holds I / 2 bytes a row when MXFP4)
        1,
        cfg,
        gated=False,
        scales=scales,
        a_scale=h_scale,
        bias=bias,
    )
    return out
