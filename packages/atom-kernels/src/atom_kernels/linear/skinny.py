"""y = x @ W^T for decode's few rows: a kernel that streams the weight once at near-copy bandwidth.

At one to a few rows a linear layer is a pure weight read, which cuBLAS streams below copy bandwidth on
Llama-3-8B's projections (the package README has the figures). Two kernels stream W in row blocks:
- one row: a GEMV that multiplies [BLOCK_N, BLOCK_K] tiles by x and reduces over K once at the end;
- 2..MAX_SKINNY_ROWS rows: the tensor-core product W_tile @ x^T (rows padded to 16, 32 or 64), so the
  weight tile feeds every row from one load; a weight of few tiles over a long K is cut along K, and the
  last program of each tile sums the partials in the same launch (split_k.py).
The GEMV can take the gated MLP's [1, 2K] pre-activation and apply silu(gate) * up while loading x,
which removes the separate activation kernel in front of the down projection. Past MAX_SKINNY_ROWS rows,
and on the CPU unless the Triton backend is asked for, the call goes to torch (cuBLAS).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from atom_kernels.activation import silu_and_mul
from atom_kernels.linear.split_k import finish_swapped_tile, store_gemv_rows
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend
from atom_kernels.tile_tickets import tile_counters

MAX_SKINNY_ROWS = 64  # rows past this are a real GEMM: cuBLAS's tiles win (benchmarks/bench_linear.py)
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


@triton.jit
def _load_x(x_ptrs, gate_offset, mask, GATED: tl.constexpr, MASKED: tl.constexpr):
    """x at x_ptrs; with GATED, silu(x) * x[+gate_offset] rounded to x's dtype (what silu_and_mul stores)."""
    x = tl.load(x_ptrs, mask=mask, other=0.0) if MASKED else tl.load(x_ptrs)
    if GATED:
        if MASKED:
            up = tl.load(x_ptrs + gate_offset, mask=mask, other=0.0).to(tl.float32)
        else:
            up = tl.load(x_ptrs + gate_offset).to(tl.float32)
        gate = x.to(tl.float32)
        x = (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptrs.dtype.element_ty)
    return x


@triton.jit
def _sigmoid_gated(x, gate_ptr, k, mask, head: tl.constexpr, stride_h):
    """x[k] * sigmoid(gate[k // head, k % head]), each rounded to x's dtype as `x * torch.sigmoid(gate)`
    rounds them: an attention output scaled by its per-head gate, read where the projection left it."""
    g = tl.load(gate_ptr + (k // head) * stride_h + k % head, mask=mask, other=0.0).to(tl.float32)
    scale = (1.0 / (1.0 + tl.exp(-g))).to(x.dtype).to(tl.float32)
    return (x.to(tl.float32) * scale).to(x.dtype)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    N,
    K,
    stride_w,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    GATED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
    gate_ptr,  # read with SIGMOID_HEAD > 0 only
    stride_gate_h,
    SIGMOID_HEAD: tl.constexpr,  # > 0: the input is x * sigmoid(gate), the gate [heads, SIGMOID_HEAD]
):
    let_next_launch(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    # The last block re-reads row N-1 instead of masking, so every weight load stays a full 16-byte vector.
    rows = tl.minimum(rn, N - 1)
    rk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + rk[None, :]
    # The first weight tile is a constant: loaded before PDL's wait, while the previous kernel finishes.
    # (Two tiles measured no different from one, on two machines; docs/perf/2026-11-28-kernels-tuning-notes.md.)
    w = tl.load(w_ptrs) if EVEN_K else tl.load(w_ptrs, mask=rk[None, :] < K, other=0.0)
    wait_for_inputs(PDL)
    x = _load_x(x_ptr + rk, K, rk < K, GATED, not EVEN_K)
    if SIGMOID_HEAD > 0:
        x = _sigmoid_gated(x, gate_ptr, rk, rk < K, SIGMOID_HEAD, stride_gate_h)
    acc = w.to(tl.float32) * x.to(tl.float32)[None, :]  # partial sums per lane; one reduction at the end
    w_ptrs += BLOCK_K
    for k in range(BLOCK_K, K, BLOCK_K):
        kk = k + rk
        w = tl.load(w_ptrs) if EVEN_K else tl.load(w_ptrs, mask=kk[None, :] < K, other=0.0)
        x = _load_x(x_ptr + kk, K, kk < K, GATED, not EVEN_K)
        if SIGMOID_HEAD > 0:
            x = _sigmoid_gated(x, gate_ptr, kk, kk < K, SIGMOID_HEAD, stride_gate_h)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        w_ptrs += BLOCK_K
    y = tl.sum(acc, 1)
    store_gemv_rows(y, y_ptr, b_ptr, rows, rn, N, HAS_BIAS)


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    partial_ptr,
    counter_ptr,
    M,
    N,
    K,
    k_per_split,
    splits,
    stride_x,
    stride_w,
    stride_y,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SPLIT: tl.constexpr,  # splits > 1: the partials meet in split_total
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    tile, split = tl.program_id(0), tl.program_id(1)
    rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(rn, N - 1)
    rm = tl.arange(0, BLOCK_M)
    k_lo = split * k_per_split  # k_per_split: a multiple of BLOCK_K
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rk = k_lo + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + rk[None, :]
    x_ptrs = x_ptr + rm[None, :].to(tl.int64) * stride_x + rk[:, None]  # x^T: [BLOCK_K, BLOCK_M]
    # No weight prefetch before the wait here: a tile loaded ahead of the loop costs its software pipeline
    # one more stage of shared memory, past Hopper's limit at 128-row tiles and four stages.
    wait_for_inputs(PDL)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # y^T: the weight's rows fill the MMA's long side
    for k in range(k_lo, k_hi, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptrs) if EVEN_K else tl.load(w_ptrs, mask=kk[None, :] < K, other=0.0)
        x = tl.load(x_ptrs, mask=(rm[None, :] < M) & (kk[:, None] < K), other=0.0)
        acc = tl.dot(w, x, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    finish_swapped_tile(
        acc, y_ptr, stride_y, rm, rn, M, N, b_ptr, rows, partial_ptr, counter_ptr, tile, splits,
        HAS_BIAS, SPLIT, BLOCK_N, BLOCK_M,
    )  # fmt: skip


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated_input: bool) -> int:
    if weight.dim() != 2:
        raise ValueError(f"linear expects weight [N, K], got shape {tuple(weight.shape)}")
    n, k = weight.shape
    width = 2 * k if gated_input else k
    if x.shape[-1] != width:
        what = "[..., 2K] (gate then up)" if gated_input else "[..., K]"
        raise ValueError(
            f"linear expects x {what} with K={k} from weight {tuple(weight.shape)}, got x of shape {tuple(x.shape)}"
        )
    if x.dtype != weight.dtype:
        raise ValueError(f"linear needs x and weight of one dtype, got {x.dtype} and {weight.dtype}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"linear expects bias [{n}], got {tuple(bias.shape)}")
    return n


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    gated_input: bool = False,
    sigmoid_gate: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """x @ weight^T + bias, the weight-streaming kernels at <= MAX_SKINNY_ROWS rows.

    x: [..., K], or [..., 2K] with gated_input (the input is then silu(x[..., :K]) * x[..., K:]);
    weight: [N, K] (nn.Linear's layout), same dtype as x; bias: [N] or None. Returns [..., N] in
    out_dtype (None: x's dtype); torch.float32 keeps the fp32 sums unrounded, as a product of fp32 copies
    of x and weight would (a router's logits), without making those copies. sigmoid_gate: [..., H, D]
    with H * D = K (last dim contiguous, heads at any stride: a gate left inside a projection's output):
    the input is x * sigmoid(sigmoid_gate), rounded as torch rounds it, formed in the one-row kernel's
    load (other shapes and backends run it first, in torch).
    The kernels run for fp16/bf16 on a GPU (or with backend="triton", under the CPU interpreter);
    everything else goes to torch. With PDL (pdl.py) the one-row kernel starts reading `weight` before
    the previous kernel has finished: no kernel still in flight on the stream may write it.
    """
    n = _check(x, weight, bias, gated_input)
    chosen = resolve_backend(backend, x.device)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    rows = x2.shape[0]
    use_kernel = (
        chosen is not Backend.TORCH
        and (x.is_cuda or backend is not None)  # on the CPU the interpreter is a test path, not a fast one
        and 0 < rows <= MAX_SKINNY_ROWS
        and x.dtype in _KERNEL_DTYPES
        and weight.stride(-1) == 1
    )
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (x.dtype, torch.float32):
        raise ValueError(f"linear's out_dtype must be x's dtype or torch.float32, got {out_dtype}")
    if sigmoid_gate is not None:
        gate = _check_sigmoid_gate(sigmoid_gate, x, gated_input)
        if not (use_kernel and rows == 1):
            x2, sigmoid_gate = x2 * torch.sigmoid(gate.reshape(x2.shape)), None
    if not use_kernel:
        h = silu_and_mul(x2, backend=chosen) if gated_input else x2
        if out_dtype != x.dtype:
            h, weight, bias = (None if t is None else t.to(out_dtype) for t in (h, weight, bias))
        return F.linear(h, weight, bias).view(*lead, n)
    if gated_input and rows > 1:
        # Computing silu * up inside the MMA kernel's load stalls its pipeline (far slower than a separate
        # kernel): past one row the activation runs as its own kernel.
        x2, gated_input = silu_and_mul(x2, backend=chosen), False
    y = torch.empty(rows, n, dtype=out_dtype, device=x.device)  # the kernels round to y's dtype
    tiles = skinny_tiles(rows, weight.shape[1], n)
    run_skinny(x2, weight, bias, y, gated_input=gated_input, tiles=tiles, sigmoid_gate=sigmoid_gate)
    return y.view(*lead, n)


def _check_sigmoid_gate(gate: torch.Tensor, x: torch.Tensor, gated_input: bool) -> torch.Tensor:
    """The gate as [rows, H, D] (a view)."""
    if gated_input or gate.dim() < 2 or gate.shape[:-2] != x.shape[:-1]:
        raise ValueError(
            f"sigmoid_gate must be [..., H, D] over x [..., H * D] (and no gated_input), got "
            f"{tuple(gate.shape)} for x {tuple(x.shape)}"
        )
    if gate.shape[-2] * gate.shape[-1] != x.shape[-1] or gate.stride(-1) != 1 or gate.dtype != x.dtype:
        raise ValueError(
            f"sigmoid_gate [..., H, D] needs H * D = {x.shape[-1]}, a contiguous last dim and x's dtype, got "
            f"{tuple(gate.shape)} {gate.dtype}"
        )
    return gate.reshape(-1, *gate.shape[-2:]) if gate.dim() != 3 else gate


@dataclass(frozen=True, slots=True)
class SkinnyTiles:
    block_n: int  # weight rows per program
    block_k: int  # reduction step
    warps: int
    stages: int
    splits: int = 1  # programs along K per output tile (2..MAX_SKINNY_ROWS rows only)


# Output rows up to which one row's GEMV takes four weight rows a program: the eight-row tiles leave such a
# projection a few hundred programs or fewer, too few to keep every SM loading (bench_linear.py --sweep,
# results/h200/archive/linear_a3b_sweep.log: faster for Qwen3-30B-A3B's o 2048x4096 and its router 128x2048;
# Llama-3-8B's 4096-row o was even)
NARROW_N = 2048


def skinny_tiles(rows: int, k: int, n: int | None = None) -> SkinnyTiles:
    """Tiles from benchmarks/bench_linear.py --sweep (Llama-3-8B's and Qwen3-30B-A3B's projections)."""
    if rows == 1 and n is not None and n <= NARROW_N:  # few output rows: more, narrower programs
        return SkinnyTiles(4, min(1024, triton.next_power_of_2(k)), 8, 1)
    if rows == 1:  # longer K steps pay off on long rows (fewer reduction steps per weight row)
        return SkinnyTiles(8, min(1024 if k >= 8192 else 512, triton.next_power_of_2(k)), 4, 1)
    block_k, splits = min(128, max(16, triton.next_power_of_2(k))), split_count(k, n)
    if rows <= 16:
        return SkinnyTiles(64, block_k, 4, 5, splits)
    # 17..64 rows (bench_linear.py --sweep at 24-64 rows, results/h200/archive/linear_rows64_sweep.log): the heads
    # and gate_up (hundreds of tiles or more) take 128-row tiles, whose x^T tile then feeds twice the weight
    # rows; short weights a sixth stage
    if n is not None and n > BIG_N:
        return SkinnyTiles(128, block_k, 4, 4)
    return SkinnyTiles(64, block_k, 4, 5 if splits > 1 else 6, splits)


BIG_N = 16384  # output rows past which a weight has tiles enough for 128-row tiles


# Past one row: programs (64 weight rows each, times splits) that a launch wants at least; the sweep's
# best split counts give about this many on Qwen3-30B-A3B's o (32 tiles: 4 splits) and Llama-3-8B's down
# (64 tiles of a 14336-long K: 2 splits).
SPLIT_PROGRAMS = 128
LONG_K = 8192  # a 64-tile weight is cut only this long: Llama-3-8B's o (4096) ran best whole


def split_count(k: int, n: int | None) -> int:
    """Splits of K for the 2..MAX_SKINNY_ROWS-row kernel: enough to reach SPLIT_PROGRAMS programs when the
    weight has fewer than 64 tiles of 64 rows (or 64 tiles over a K of LONG_K or more), each split >= 1024."""
    if n is None:
        return 1
    tiles = triton.cdiv(n, 64)
    if tiles > 64 or (tiles == 64 and k < LONG_K):
        return 1
    splits = 1
    while tiles * splits < SPLIT_PROGRAMS and k // (2 * splits) >= 1024:
        splits *= 2
    return splits


def run_skinny(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    *,
    gated_input: bool,
    tiles: SkinnyTiles,
    sigmoid_gate: torch.Tensor | None = None,
) -> None:
    """The kernels without checks (linear() validates): x [M, K] (or [1, 2K] gated) with a contiguous last
    dim, y [M, N] contiguous; sigmoid_gate [1, H, D] (one row)."""
    if (gated_input or sigmoid_gate is not None) and x.shape[0] != 1:
        raise ValueError("the gated input is fused for one row only")
    rows, (n, k) = x.shape[0], weight.shape
    b = bias if bias is not None else weight  # never read without HAS_BIAS
    tiles_n = triton.cdiv(n, tiles.block_n)
    even_k = k % tiles.block_k == 0
    pdl = pdl_launch(x.device)
    if rows == 1:
        gate = dict(gate_ptr=x, stride_gate_h=0, SIGMOID_HEAD=0)
        if sigmoid_gate is not None:
            gate = dict(
                gate_ptr=sigmoid_gate,
                stride_gate_h=sigmoid_gate.stride(1),
                SIGMOID_HEAD=sigmoid_gate.shape[2],
            )
        _gemv_kernel[(tiles_n,)](
            x, weight, b, y, n, k, weight.stride(0), BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            EVEN_K=even_k, GATED=gated_input, HAS_BIAS=bias is not None, PDL=pdl, num_warps=tiles.warps,
            num_stages=tiles.stages, launch_pdl=pdl, **gate,
        )  # fmt: skip
        return
    if rows > MAX_SKINNY_ROWS:
        raise ValueError(f"the skinny kernel takes at most {MAX_SKINNY_ROWS} rows, got {rows}")
    block_m = max(16, triton.next_power_of_2(rows))
    k_per_split = triton.cdiv(triton.cdiv(k, tiles.splits), tiles.block_k) * tiles.block_k
    splits = triton.cdiv(k, k_per_split)  # no empty split
    if splits > 1:
        partial = torch.empty(
            splits * tiles_n * tiles.block_n * block_m, dtype=torch.float32, device=x.device
        )
        counters = tile_counters(x.device, tiles_n)
    else:
        partial = counters = y  # never read with one split
    _skinny_kernel[(tiles_n, splits)](
        x, weight, b, y, partial, counters, rows, n, k, k_per_split, splits, x.stride(0), weight.stride(0),
        y.stride(0), BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, BLOCK_M=block_m, SPLIT=splits > 1,
        EVEN_K=even_k, HAS_BIAS=bias is not None, PDL=pdl, num_warps=tiles.warps, num_stages=tiles.stages,
        launch_pdl=pdl,
    )  # fmt: skip
