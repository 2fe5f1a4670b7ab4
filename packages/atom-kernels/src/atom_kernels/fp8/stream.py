"""Weight-only fp8 linear for decode's few rows: stream the e4m3 weight once, x stays in its own dtype.

At 1..MAX_SKINNY_ROWS rows the layer is a read of the weight, and e4m3 halves it against bf16. The kernels
follow linear/skinny.py:
- one row: a GEMV over [BLOCK_N, SUBS, SUB_K] tiles (BLOCK_K = SUBS * SUB_K channels a step), partial sums
  per lane, one reduction at the end;
- 2..16 rows: the tensor-core product W_tile @ x^T with rows padded to 16, the e4m3 tile converted (exactly)
  to x's dtype.
Scales: when SUB_K (the skinny kernel's BLOCK_K) divides block_k, every weight row has one scale per
segment ("uniform"): the GEMV scales the weight segment in registers and the skinny kernel scales the
fp32 product of the step, so the weight is never rounded. Otherwise (a block_k with a small power-of-two
factor) each element's scale is gathered and the dequantized tile rounded to x's dtype before the MMA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.fp8.packs import scaled_rows
from atom_kernels.linear.split_k import store_gemv_rows
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs

MAX_SKINNY_ROWS = 16


@dataclass(frozen=True, slots=True)
class StreamTiles:
    block_n: int  # weight rows per program
    sub_k: int  # channels of one scale segment (the skinny kernel's step)
    subs: int  # segments a step
    uniform: bool  # sub_k divides block_k: one scale per row per segment
    warps: int
    stages: int


def stream_tiles(rows: int, n: int, k: int, block_k: int) -> StreamTiles:
    """Tiles from benchmarks/sweep_fp8_linear.py (Llama-3-8B's projections, block_k 128):
    the GEMV takes long steps over few rows on long or wide weights, the skinny kernel taller row tiles
    on wider weights. Per-element scales (no power-of-two factor >= 16 in block_k) gather a scale per
    weight byte: shorter steps keep that tile in registers."""
    pow2_factor = block_k & -block_k  # the largest power of two dividing block_k
    if rows == 1:
        if pow2_factor < 16:
            step = min(128, triton.next_power_of_2(k))
            return StreamTiles(
                16 if n >= 4096 else 8 if n >= 1024 else 4, min(64, step), step // min(64, step), False, 4, 1
            )
        long = k >= 8192 or n >= 16384
        step = min(1024 if long else 512, triton.next_power_of_2(k))
        sub_k = min(pow2_factor, step)
        block_n = (8 if long else 16) if n >= 1024 else 4
        return StreamTiles(block_n, sub_k, step // sub_k, True, 4 if long else 8, 1 if long else 3)
    step = min(128, max(16, triton.next_power_of_2(k)))
    sub_k = min(pow2_factor, step) if pow2_factor >= 16 else min(64, step)
    block_n, subs = (128, 1) if n >= 16384 else (64, 2) if n >= 4096 else (32, 1)
    if pow2_factor % sub_k != 0:
        subs = 1
    return StreamTiles(block_n, sub_k, subs, pow2_factor % sub_k == 0, 4, 3)


@triton.jit
def _weight_step(w_ptrs, s_rows, k, koff, seg, K, bk, UNIFORM: tl.constexpr, EVEN_K: tl.constexpr):
    """One step's weight tile [BLOCK_N, SUBS, SUB_K] and its scales (broadcastable to it), both constants."""
    kk = k + koff
    w = tl.load(w_ptrs) if EVEN_K else tl.load(w_ptrs, mask=kk[None, :, :] < K, other=0.0)
    if UNIFORM:  # one scale per (row, segment): [BLOCK_N, SUBS, 1]
        s = tl.load(s_rows[:, None] + ((k + seg) // bk)[None, :], mask=(k + seg < K)[None, :], other=0.0)
        s = s[:, :, None]
    else:  # (one return: Triton's compiler refuses returns of two shapes, even under a constexpr branch)
        s = tl.load(s_rows[:, None, None] + (kk // bk)[None, :, :], mask=(kk < K)[None, :, :], other=0.0)
    return w, s


@triton.jit
def _x_step(x_ptr, kk, K, EVEN_K: tl.constexpr):
    return tl.load(x_ptr + kk) if EVEN_K else tl.load(x_ptr + kk, mask=kk < K, other=0.0)


@triton.jit
def _gemv_kernel(
    x_ptr,
    wt,
    b_ptr,
    y_ptr,
    N,
    K,
    bk,
    BLOCK_N: tl.constexpr,
    SUBS: tl.constexpr,
    SUB_K: tl.constexpr,
    UNIFORM: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    # The last block re-reads row N-1 instead of masking, so every weight load stays a full 16-byte vector.
    rows = tl.minimum(rn, N - 1)
    seg = tl.arange(0, SUBS) * SUB_K  # [SUBS] segment starts within a step
    koff = seg[:, None] + tl.arange(0, SUB_K)[None, :]  # [SUBS, SUB_K]
    w_ptrs = wt.q + rows[:, None, None].to(tl.int64) * wt.stride + koff[None, :, :]
    s_rows = (
        wt.scale + (rows // wt.block_rows).to(tl.int64) * wt.stride_scale
    )  # [BLOCK_N]: each weight row's scale row
    # The first step's weight and scales are constants: loaded before PDL's wait, while the previous
    # kernel finishes (as linear's GEMV does); x only after it.
    w, s = _weight_step(w_ptrs, s_rows, 0, koff, seg, K, bk, UNIFORM, EVEN_K)
    wait_for_inputs(PDL)
    acc = w.to(tl.float32) * s * _x_step(x_ptr, koff, K, EVEN_K).to(tl.float32)[None, :, :]
    w_ptrs += SUBS * SUB_K
    for k in range(SUBS * SUB_K, K, SUBS * SUB_K):
        w, s = _weight_step(w_ptrs, s_rows, k, koff, seg, K, bk, UNIFORM, EVEN_K)
        acc += w.to(tl.float32) * s * _x_step(x_ptr, k + koff, K, EVEN_K).to(tl.float32)[None, :, :]
        w_ptrs += SUBS * SUB_K
    y = tl.sum(tl.sum(acc, 2), 1)
    store_gemv_rows(y, y_ptr, b_ptr, rows, rn, N, HAS_BIAS)


@triton.jit
def _skinny_kernel(
    x_ptr,
    wt,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    bk,
    stride_x,
    stride_y,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # channels of one product (one scale segment when UNIFORM)
    SUBS: tl.constexpr,  # products a step: SUBS * BLOCK_K channels loaded together
    BLOCK_M: tl.constexpr,
    UNIFORM: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(rn, N - 1)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    w_ptrs = wt.q + rows[:, None].to(tl.int64) * wt.stride + rk[None, :]
    x_ptrs = x_ptr + rm[None, :].to(tl.int64) * stride_x + rk[:, None]  # x^T: [BLOCK_K, BLOCK_M]
    s_rows = wt.scale + (rows // wt.block_rows).to(tl.int64) * wt.stride_scale
    # No weight prefetch before the wait: as in linear's skinny kernel, a tile loaded ahead of the loop
    # would cost the software pipeline a stage of shared memory.
    wait_for_inputs(PDL)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # y^T: the weight's rows fill the MMA's long side
    for k0 in range(0, K, SUBS * BLOCK_K):
        for j in tl.static_range(SUBS):
            k = k0 + j * BLOCK_K
            kk = k + rk
            if EVEN_K:
                w = tl.load(w_ptrs + j * BLOCK_K)
            else:
                w = tl.load(w_ptrs + j * BLOCK_K, mask=kk[None, :] < K, other=0.0)
            x = tl.load(x_ptrs + j * BLOCK_K, mask=(rm[None, :] < M) & (kk[:, None] < K), other=0.0)
            if UNIFORM:  # e4m3 -> x's dtype is exact; the row scales multiply the fp32 product
                s = tl.load(s_rows + k // bk, mask=k < K, other=0.0)
                acc += tl.dot(w.to(x.dtype), x, input_precision=PRECISION) * s[:, None]
            else:
                s = tl.load(s_rows[:, None] + (kk // bk)[None, :], mask=kk[None, :] < K, other=0.0)
                acc = tl.dot((w.to(tl.float32) * s).to(x.dtype), x, acc, input_precision=PRECISION)
        w_ptrs += SUBS * BLOCK_K
        x_ptrs += SUBS * BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows).to(tl.float32)[:, None]
    y_ptrs = y_ptr + rm[None, :].to(tl.int64) * stride_y + rn[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rm[None, :] < M) & (rn[:, None] < N))


def run_stream(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None,
    y: torch.Tensor,
    *,
    tiles: StreamTiles | None = None,
) -> None:
    """The kernels without checks (fp8_linear validates): x [M, K] with 1 <= M <= 16, weight [N, K] e4m3,
    scale [ceil(N/bn), ceil(K/bk)] fp32, every last dim contiguous; writes y [M, N] (contiguous)."""
    rows, (n, k) = x.shape[0], weight.shape
    bn, bk = block
    t = tiles or stream_tiles(rows, n, k, bk)
    b = bias if bias is not None else scale  # never read without HAS_BIAS
    grid = (triton.cdiv(n, t.block_n),)
    step = t.subs * t.sub_k
    pdl = pdl_launch(x.device)
    if rows == 1:
        _gemv_kernel[grid](
            x, scaled_rows(weight, scale, bn), b, y, n, k, bk, BLOCK_N=t.block_n, SUBS=t.subs, SUB_K=t.sub_k,
            UNIFORM=t.uniform, EVEN_K=k % step == 0, HAS_BIAS=bias is not None, PDL=pdl, num_warps=t.warps,
            num_stages=t.stages, launch_pdl=pdl,
        )  # fmt: skip
    else:
        precision = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 x: fp32 products, not TF32
        _skinny_kernel[grid](
            x, scaled_rows(weight, scale, bn), b, y, rows, n, k, bk, x.stride(0), y.stride(0),
            BLOCK_N=t.block_n, BLOCK_K=t.sub_k, SUBS=t.subs, BLOCK_M=16, UNIFORM=t.uniform,
            EVEN_K=k % step == 0, HAS_BIAS=bias is not None, PRECISION=precision, PDL=pdl,
            num_warps=t.warps, num_stages=t.stages, launch_pdl=pdl,
        )  # fmt: skip
