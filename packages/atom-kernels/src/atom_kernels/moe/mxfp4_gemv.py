"""Few tokens' MXFP4 expert GEMMs as GEMVs: each program streams a slab of one expert's bytes once.

A single token gives each of its k experts one row (and a few tokens mostly one each), so the product is a
matrix-vector one, and its cost is the conversion of every e2m1 value on the way from the bytes to the
multiply. At one token's tile the scaled-dot kernel (expert_gemm.py) issues about 17 instructions a value
in its k loop (upcast, scale, layout changes for an MMA whose rows are mostly padding); this loop about 5
(sm90 SASS, compiled offline: benchmarks/compile_moe_mxfp4_sm90.py). Per pair of values two shifts, a
mask and a merge place the nibbles' magnitude bits on fp16's mantissa top bit and two low exponent bits
and their signs on the sign bits (so each fp16 holds e2m1 * 2**-14 exactly, code 1 as fp16's subnormal
2**-15), then per value one exact conversion to fp32 and one FMA. The e8m0 scale multiplies each 32-value
group's partial sum once, together with the 2**14 (built from fp32's exponent bits: exact for scale bytes
up to 240, i.e. scales up to 2**113; real checkpoints hold about 2**-20 .. 2**0). On the GPU the bit
operations are inline PTX, one int32 word (eight values) at a time; Triton's CPU interpreter runs an
equivalent built from Triton's own integer ops.

Layout as the scaled-dot kernel's (expert_gemm.py): bytes [E, N, K / 2] (low nibble first along K) and
scales [E, N, K / 32]; rows are (token, expert) pairs in topk_ids' order, one a program row: no ordering.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.moe.expert_gemm import (
    Activations,
    Epilogue,
    ExpertWeights,
    PairRows,
    _e2m1_times_scale,
    gated_activation,
)
from atom_kernels.moe.expert_mlp import SILU, ExpertActivation, ExpertBiases
from atom_kernels.moe.mxfp4 import ExpertMxfp4
from atom_kernels.settings import SETTINGS

# Two to the power the fp16 values carry (e2m1 * 2**-FP16_SHIFT), undone in the group scale's exponent
FP16_SHIFT = tl.constexpr(14)


@triton.jit
def _e2m1_ptx(word):
    """int32 words (eight e2m1 codes, code j in bits 4j..4j+3: K's order) -> eight fp32 tensors, code j's
    value times 2**-14. Nibbles 16 bits apart (j and j + 4) are placed as one fp16 pair: a shift for the
    magnitude bits, one for the sign, their masked merge, then each half converted to fp32 (exact)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a, b, p;
        .reg .b16 l, h;
        shl.b32 a, $8, 9; shl.b32 b, $8, 12; and.b32 a, a, 0x0E000E00; lop3.b32 p, a, b, 0x80008000, 0xF8;
        mov.b32 {l, h}, p; cvt.f32.f16 $0, l; cvt.f32.f16 $4, h;
        shl.b32 a, $8, 5; shl.b32 b, $8, 8; and.b32 a, a, 0x0E000E00; lop3.b32 p, a, b, 0x80008000, 0xF8;
        mov.b32 {l, h}, p; cvt.f32.f16 $1, l; cvt.f32.f16 $5, h;
        shl.b32 a, $8, 1; shl.b32 b, $8, 4; and.b32 a, a, 0x0E000E00; lop3.b32 p, a, b, 0x80008000, 0xF8;
        mov.b32 {l, h}, p; cvt.f32.f16 $2, l; cvt.f32.f16 $6, h;
        shr.b32 a, $8, 3; and.b32 a, a, 0x0E000E00; lop3.b32 p, a, $8, 0x80008000, 0xF8;
        mov.b32 {l, h}, p; cvt.f32.f16 $3, l; cvt.f32.f16 $7, h;
        }""",
        constraints="=r,=r,=r,=r,=r,=r,=r,=r,r",
        args=[word],
        dtype=(tl.float32,) * 8,
        is_pure=True,
        pack=1,
    )


@triton.jit
def _e2m1(word, j: tl.constexpr):
    """Code j of int32 words as fp32 times 2**-14, from Triton's integer ops (the interpreter's path)."""
    return _e2m1_times_scale((word >> (4 * j)) & 15, 127 - FP16_SHIFT, tl.float32)


@triton.jit
def _load_step(w_ptrs, s_ptrs, ok):
    """A k-step's words [BN, G, 4] (int32: a 32-value group is four) and e8m0 exponents [BN, G] (int32) at
    w_ptrs / s_ptrs; groups past K (ok [G] false) read as zeros."""
    words = tl.load(w_ptrs, mask=ok[None, :, None], other=0)
    return words, tl.load(s_ptrs, mask=ok[None, :], other=0).to(tl.int32)


@triton.jit
def _step_products(x_ptrs, x_ok, words, exponent, PTX: tl.constexpr):
    """A k-step's partial products [BN, G], one a 32-value group: x (x_ptrs [G, 4, 8], code j of word q of
    group g at k = 32 g + 8 q + j) times the words' values, each group's sum times its scale."""
    if PTX:
        v0, v1, v2, v3, v4, v5, v6, v7 = _e2m1_ptx(words)
    else:
        v0, v1, v2, v3 = _e2m1(words, 0), _e2m1(words, 1), _e2m1(words, 2), _e2m1(words, 3)
        v4, v5, v6, v7 = _e2m1(words, 4), _e2m1(words, 5), _e2m1(words, 6), _e2m1(words, 7)
    # x's 32 values a group in one load (16-byte vectors rather than eight strided scalar loads), then
    # split into code j's [G, 4] by three halvings of the last dim (j = 4a + 2b + c: each split takes
    # the last of a, b, c)
    x = tl.load(x_ptrs, mask=x_ok, other=0.0).to(tl.float32)  # [G, 4, 8]
    x_even, x_odd = tl.split(tl.reshape(x, (x.shape[0], 4, 2, 2, 2)))
    x04, x26 = tl.split(x_even)
    x15, x37 = tl.split(x_odd)
    x0, x4 = tl.split(x04)
    x2, x6 = tl.split(x26)
    x1, x5 = tl.split(x15)
    x3, x7 = tl.split(x37)
    # two chains of four FMAs (even and odd codes): half the dependent latency of one chain of eight
    t = v0 * x0[None, :, :]
    u = v1 * x1[None, :, :]
    t += v2 * x2[None, :, :]
    u += v3 * x3[None, :, :]
    t += v4 * x4[None, :, :]
    u += v5 * x5[None, :, :]
    t += v6 * x6[None, :, :]
    u += v7 * x7[None, :, :]
    t += u
    scale = ((exponent + FP16_SHIFT) << 23).to(tl.float32, bitcast=True)  # 2**(e8m0 - 127 + 14), exact
    return tl.sum(t, axis=2) * scale


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
    wts: expert_gemm.ExpertWeights (bytes as int32 words, scales); pairs: expert_gemm.PairRows with
    tile_expert = each pair's expert (topk_ids flattened); epi: expert_gemm.Epilogue. Program: one pair, BLOCK_N
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
    q = tl.arange(0, 4)  # a group's four words
    # wts.w is the bytes viewed as int32 words [E, N, K / 8] (strides in words). K is whole groups of 32,
    # so every row starts on a 16-byte boundary: said here, as Triton learns it only of strides that are
    # multiples of 16 elements (gpt-oss's 360 words is not), for the 16-byte loads
    row_start = tl.multiple_of(expert * wts.stride_we + rows * wts.stride_wn, 4)
    w_ptrs = wts.w + row_start[:, None, None] + (g * 4)[None, :, None] + q[None, None, :]
    s_ptrs = wts.scale + expert * wts.stride_se + rows[:, None] * wts.stride_sn + g[None, :]
    j = tl.arange(0, 8)
    x_rows = act.a + a_row.to(tl.int64) * act.stride_am
    x_ptrs = x_rows + (g * 32)[:, None, None] + (8 * q)[None, :, None] + j[None, None, :]  # [G, 4, 8]
    # per group until the loop ends: a sum over the groups each k-step would cross threads every step
    acc = tl.zeros([BLOCK_N, G], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, G], dtype=tl.float32)
    up_w_ptrs, up_s_ptrs = w_ptrs + N * wts.stride_wn, s_ptrs + N * wts.stride_sn  # w13's up half
    words, exponent = _load_step(w_ptrs, s_ptrs, g * 32 < K)
    words_up, exponent_up = words, exponent  # unread without GATED
    if GATED:
        words_up, exponent_up = _load_step(up_w_ptrs, up_s_ptrs, g * 32 < K)
    for k0 in range(0, K, BLOCK_K):
        # The next k-step's words are loaded before this one's are converted, so a program keeps two
        # steps in flight (Triton pipelines only loads that feed a dot). K is whole groups of 32: a last
        # partial k-step is masked by group, and the load past the last step by all of them.
        k1 = k0 + BLOCK_K
        next_words, next_exponent = _load_step(w_ptrs + k1 // 8, s_ptrs + k1 // 32, g * 32 < K - k1)
        next_words_up, next_exponent_up = next_words, next_exponent
        if GATED:
            next_words_up, next_exponent_up = _load_step(
                up_w_ptrs + k1 // 8, up_s_ptrs + k1 // 32, g * 32 < K - k1
            )
        x_ok = (g * 32 < K - k0)[:, None, None]
        acc += _step_products(x_ptrs + k0, x_ok, words, exponent, PTX)
        if GATED:
            acc_up += _step_products(x_ptrs + k0, x_ok, words_up, exponent_up, PTX)
        words, exponent, words_up, exponent_up = next_words, next_exponent, next_words_up, next_exponent_up
    acc = tl.sum(acc, axis=1)
    if HAS_BIAS:  # the up half's biases sit N columns after the gate half's
        b_ptrs = epi.bias + expert * epi.stride_be + cols
        acc += tl.load(b_ptrs, mask=col_ok, other=0.0).to(tl.float32)
        if GATED:
            acc_up = tl.sum(acc_up, axis=1) + tl.load(b_ptrs + N, mask=col_ok, other=0.0).to(tl.float32)
    elif GATED:
        acc_up = tl.sum(acc_up, axis=1)
    if GATED:
        acc = gated_activation(acc, acc_up, epi, ACT)
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

    def __post_init__(self):
        if self.block_k < 32 or self.block_k & (self.block_k - 1):
            raise ValueError(
                f"GemvConfig.block_k must be a power of two >= 32 (whole groups), got {self.block_k}"
            )


def gemv_config(*, interpret: bool = False) -> GemvConfig:
    """benchmarks/sweep_moe_mxfp4.py's choice at gpt-oss's experts; small steps under the interpreter."""
    if interpret:
        return GemvConfig(16, 64, 1)
    return GemvConfig(16, 256, 4)


def _launch(a, w, scale, out, pairs: PairRows, n, k, cfg: GemvConfig, *, gated, weighted, bias, activation):
    """w: MXFP4 bytes [E, N, K / 2] (rows contiguous), read as int32 words."""
    words = w.view(torch.int32)  # K is whole groups of 32: a row is whole words
    # the kernel tells Triton every row starts on 16 bytes (tl.multiple_of): hold it to that
    if words.data_ptr() % 16 or words.stride(0) % 4 or words.stride(1) % 4:
        raise ValueError(
            f"MXFP4 GEMV weights must start on 16 bytes with rows of whole 16-byte groups; got address "
            f"{words.data_ptr()} % 16 = {words.data_ptr() % 16}, strides {tuple(w.stride())} bytes"
        )
    weights = ExpertWeights(words, scale, words.stride(0), words.stride(1), scale.stride(0), scale.stride(1))
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


# Pairs per expert below which the GEMVs run (besides one token, always): each pair reads its expert's
# bytes itself, so two pairs on one expert read it twice, and with a quarter as many pairs as experts about
# one read in ten is such a repeat.
GEMV_MAX_PAIRS_PER_EXPERT = 0.25


def gemv_takes(tokens: int, top_k: int, experts: int) -> bool:
    """Whether fused_experts runs MXFP4 experts as GEMVs (one token, or few pairs for the experts)."""
    return tokens == 1 or tokens * top_k <= GEMV_MAX_PAIRS_PER_EXPERT * experts


def mxfp4_gemv_experts(
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
    """x [T, H]; w13 [E, 2I, H / 2] and w2 [E, H, I / 2] MXFP4 bytes with mxfp4's scales; topk_ids [T, k];
    pair_weights [T * k] fp32 -> [T * k, H]: pair p = t * k + j's expert output times its weight, for
    combine_topk to sum. Two launches and no ordering: pair p's rows are p."""
    ids = topk_ids.reshape(-1)
    ids = ids if ids.is_contiguous() else ids.contiguous()
    num_pairs, top_k = ids.numel(), topk_ids.shape[1]
    inter, hidden = w13.shape[1] // 2, x.shape[1]
    pairs = PairRows(ids, ids, ids, pair_weights, num_pairs, top_k)  # sorted_pairs, num_padded: unread
    h = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    _launch(
        x, w13, mxfp4.w13, h, pairs, inter, hidden, cfg, gated=True, weighted=False,
        bias=None if biases is None else biases.w13, activation=activation,
    )  # fmt: skip
    y = torch.empty(num_pairs, w2.shape[1], dtype=x.dtype, device=x.device)
    _launch(
        h, w2, mxfp4.w2, y, pairs._replace(top_k=1), w2.shape[1], inter, cfg, gated=False, weighted=True,
        bias=None if biases is None else biases.w2, activation=SILU,
    )  # fmt: skip
    return y
