"""W8A8 for decode's few rows: x quantized per token and block_k group, then e4m3 tiles straight into the
tensor cores, the weight's rows on the MMA's long side.

The weight-only kernels (stream.py) convert every weight byte to x's dtype before multiplying, which at 1
byte per element costs more instructions than the read can hide. Here the weight tile goes from memory to
the MMA unconverted: y^T [BLOCK_N, 16] = W_tile [BLOCK_N, bk] @ xq^T [bk, 16] per k-step (rows past M are
zero), the step's fp32 product scaled by the weight rows' scales and the tokens' activation scales, as the
W8A8 GEMM does (gemm.py) with the operands swapped. It is also what the checkpoint's
`activation_scheme: dynamic` describes for every row count. split_k > 1 cuts K over programs (more bytes
in flight for short, wide weights); the last program of each tile sums the fp32 partials in the same
launch (linear/split_k.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.fp8.gemm import MIN_FP8_DOT_K
from atom_kernels.fp8.packs import scaled_rows
from atom_kernels.linear.split_k import finish_swapped_tile
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.tile_tickets import tile_counters

MAX_ROWS = 64  # x rows on the MMA's N side, padded to 16, 32 or 64


@dataclass(frozen=True, slots=True)
class SkinnyTiles:
    block_n: int  # weight rows per program
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


def skinny_tiles(n: int, k: int, block_k: int, rows: int = 16) -> SkinnyTiles:
    """From benchmarks/sweep_fp8_skinny.py (Llama-3-8B's and DeepSeek-V3's projections).
    1..16 rows: 64-row tiles of one warpgroup everywhere; long K (down_proj, DeepSeek's o_proj, q_a/kv_a:
    7168-16384) cut in four, with five stages. 17..64 rows (results/h200/archive/sweep_fp8_skinny_rows32_64.log):
    the largest weights and short ones (o_proj) take 128-row tiles, whose x^T operand is then shared by
    twice the weight rows; fewer stages at 64 rows, where each stage holds a wider x tile."""
    if rows <= 16:
        if k >= 6144:
            return SkinnyTiles(64, 4, 4, 5)
        return SkinnyTiles(64, 1, 4, 4)
    stages = 5 if rows <= 32 else 3
    if n * k >= 64 << 20:
        return SkinnyTiles(128, 4 if k >= 6144 else 1, 4, stages)
    if k >= 6144:
        return SkinnyTiles(64, 4, 4, 5)
    if n <= 4096:
        return SkinnyTiles(128, 4, 4, stages)
    return SkinnyTiles(64, 1, 4, stages)


@triton.jit
def _w8a8_skinny_kernel(
    act,
    wt,
    b_ptr,
    c_ptr,
    partial_ptr,
    counter_ptr,
    M,
    N,
    K,
    steps_per_split,
    splits,
    stride_cm,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # the scale group block_k
    DOT_K: tl.constexpr,  # max(BLOCK_K, MIN_FP8_DOT_K), zero past BLOCK_K
    BLOCK_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,  # splits > 1: the partials meet in split_total
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    pid_n, split = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.minimum(rn, N - 1).to(tl.int64)  # edge tiles re-read the last row: full vector loads
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    ks = tl.arange(0, DOT_K)
    first = split * steps_per_split
    last = tl.minimum(first + steps_per_split, tl.cdiv(K, BLOCK_K))
    w_ptrs = wt.q + cols[:, None] * wt.stride + (first * BLOCK_K + ks)[None, :]  # [BLOCK_N, DOT_K]
    a_ptrs = act.q + rm[None, :].to(tl.int64) * act.stride + (first * BLOCK_K + ks)[:, None]  # xq^T
    ws_ptrs = wt.scale + (cols // wt.block_rows) * wt.stride_scale
    as_ptrs = act.scale + rm * act.stride_scale
    wait_for_inputs(PDL)  # no weight prefetch ahead of the pipelined loop (shared memory, as in stream.py)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for step in range(first, last):
        if EVEN_K and BLOCK_K == DOT_K:
            w = tl.load(w_ptrs)
            a = tl.load(a_ptrs, mask=m_ok[None, :], other=0.0)
        else:
            k_ok = (ks < BLOCK_K) & (ks < K - step * BLOCK_K)
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
            a = tl.load(a_ptrs, mask=k_ok[:, None] & m_ok[None, :], other=0.0)
        w_s = tl.load(ws_ptrs + step)
        a_s = tl.load(as_ptrs + step, mask=m_ok, other=0.0)
        acc += tl.dot(w, a) * w_s[:, None] * a_s[None, :]
        w_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
    finish_swapped_tile(
        acc, c_ptr, stride_cm, rm, rn, M, N, b_ptr, cols, partial_ptr, counter_ptr, pid_n, splits,
        HAS_BIAS, SPLIT, BLOCK_N, BLOCK_M,
    )  # fmt: skip


def w8a8_skinny(
    xq: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    tiles: SkinnyTiles | None = None,
) -> torch.Tensor:
    """The kernel without checks (fp8_linear validates): xq [M, K] e4m3 with M <= MAX_ROWS and xs [M, ceil(K/bk)]
    fp32 (quantize_act with group bk), weight [N, K] e4m3, scale [ceil(N/bn), ceil(K/bk)] fp32, every last
    dim contiguous; bk a power of two >= 16. Returns [M, N] in out_dtype."""
    bn, bk = block
    m, k = xq.shape
    n = weight.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"w8a8_skinny takes at most {MAX_ROWS} rows, got {m}")
    t = tiles or skinny_tiles(n, k, bk, m)
    steps = triton.cdiv(k, bk)
    split = max(1, min(t.split_k, steps))
    per_split = triton.cdiv(steps, split)
    split = triton.cdiv(steps, per_split)  # no empty split
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    grid = (triton.cdiv(n, t.block_n), split)
    block_m = max(16, triton.next_power_of_2(m))
    if split > 1:
        partial = torch.empty(split * grid[0] * t.block_n * block_m, dtype=torch.float32, device=xq.device)
        counters = tile_counters(xq.device, grid[0])
    else:
        partial = counters = out  # never read with one split
    b = bias if bias is not None else scale  # never read without HAS_BIAS
    pdl = pdl_launch(xq.device)
    _w8a8_skinny_kernel[grid](
        scaled_rows(xq, xs), scaled_rows(weight, scale, bn), b, out, partial, counters, m, n, k, per_split,
        split, out.stride(0), BLOCK_N=t.block_n, BLOCK_K=bk,
        DOT_K=max(bk, MIN_FP8_DOT_K), BLOCK_M=block_m, EVEN_K=k % bk == 0, HAS_BIAS=bias is not None,
        SPLIT=split > 1, PDL=pdl, num_warps=t.num_warps, num_stages=t.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return out
