"""Block-scaled W8A8 GEMM: y = (xq * xs) @ (weight * scale)^T + bias, for prefill's many rows.

Each k-step covers one block_k group, so a tile's rows have one activation scale each (xs[m, step]) and its
columns one weight scale each (scale[n // block_n, step]). The e4m3 tiles go to the tensor cores unscaled;
the step's fp32 product is multiplied by xs[:, None] * ws[None, :] and added to an fp32 accumulator, which
also keeps the fp8 MMA's short internal accumulation to one group (DeepSeek-V3's "promotion" interval).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.fp8.packs import scaled_rows
from atom_kernels.settings import SETTINGS
from atom_kernels.tile_order import grouped_tile

MIN_FP8_DOT_K = 32  # the fp8 MMA's smallest K: a narrower group is zero-padded to it


@dataclass(frozen=True, slots=True)
class GemmTiles:
    block_m: int
    block_n: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


def gemm_tiles(m: int, *, interpret: bool = SETTINGS.triton_interpret) -> GemmTiles:
    """Output tile by row count (block_k is the scale group), from benchmarks/sweep_fp8_linear.py: one
    warpgroup on a 64x128 tile, three stages, beat every 128-row tile at 4096 rows (128x128 with 8 warps
    spills: the per-step scaled accumulate holds the step's product beside the accumulator)."""
    if interpret:  # the CPU interpreter: small tiles keep the numpy emulation quick
        return GemmTiles(16, 32, group_m=2, num_warps=1, num_stages=1)
    if m <= 64:
        return GemmTiles(64, 64, num_warps=4, num_stages=4)
    return GemmTiles(64, 128, num_warps=4, num_stages=3)


@triton.jit
def _w8a8_kernel(
    act,
    wt,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # the scale group block_k: one scale per row and per column each step
    DOT_K: tl.constexpr,  # max(BLOCK_K, MIN_FP8_DOT_K): the loaded width, zero past BLOCK_K
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(pid, tiles_m, tiles_n, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Edge tiles re-read the last row/column instead of masking: loads stay full vectors, the store masks.
    rows = tl.minimum(rm, M - 1).to(tl.int64)
    cols = tl.minimum(rn, N - 1).to(tl.int64)
    ks = tl.arange(0, DOT_K)
    a_ptrs = act.q + rows[:, None] * act.stride + ks[None, :]
    w_ptrs = wt.q + cols[None, :] * wt.stride + ks[:, None]  # W^T tile [DOT_K, BLOCK_N], K-major
    as_ptrs = act.scale + rows * act.stride_scale
    ws_ptrs = wt.scale + (cols // wt.block_rows) * wt.stride_scale  # each column's scale row
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K and BLOCK_K == DOT_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_ok = (ks < BLOCK_K) & (ks < K - step * BLOCK_K)
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        a_s = tl.load(as_ptrs + step)
        w_s = tl.load(ws_ptrs + step)
        acc += tl.dot(a, w) * a_s[:, None] * w_s[None, :]
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols).to(tl.float32)[None, :]
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def w8a8_gemm(
    xq: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    """The kernel without checks (fp8_linear validates): xq [M, K] e4m3 and xs [M, ceil(K/bk)] fp32 (from
    quantize_act with group bk), weight [N, K] e4m3 and scale [ceil(N/bn), ceil(K/bk)] fp32, every last dim
    contiguous; bk a power of two >= 16. Returns [M, N] in out_dtype."""
    bn, bk = block
    m, k = xq.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return y
    t = tiles or gemm_tiles(m)
    grid = (triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n),)
    b = bias if bias is not None else scale  # never read without HAS_BIAS
    _w8a8_kernel[grid](
        scaled_rows(xq, xs), scaled_rows(weight, scale, bn), b, y, m, n, k, y.stride(0), BLOCK_M=t.block_m,
        BLOCK_N=t.block_n, BLOCK_K=bk, DOT_K=max(bk, MIN_FP8_DOT_K), GROUP_M=t.group_m, EVEN_K=k % bk == 0,
        HAS_BIAS=bias is not None, num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    return y
