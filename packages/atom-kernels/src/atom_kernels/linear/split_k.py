"""Split-K in one launch: the last program of an output tile sums the tile's partials.

A weight with few output rows and a long K (Llama-3-8B's down projection: 4096 x 14336) gives a tile per
64 rows, too few programs to keep every SM loading. Cutting K over programs fixes that, but summing the
fp32 partials in a second kernel (what cuBLAS's split-K does) costs a launch. Here each program stores its
partial tile and takes a ticket (tile_tickets.py); the program that draws the last sums every partial in
split order, so the result does not depend on which program finished last.
"""

from __future__ import annotations

import triton
import triton.language as tl

from atom_kernels.tile_tickets import draws_last, reset_ticket


@triton.jit
def split_total(
    acc,
    partial_ptr,
    counter_ptr,
    tile,
    split,
    tiles,
    splits,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    """Store this program's fp32 [ROWS, COLS] partial for `tile`; return (whether this program drew the last
    ticket, the sum of all `splits` partials in split order, zeros for the others).

    partial_ptr: fp32 [splits, tiles, ROWS, COLS]; counter_ptr: int32 [tiles], zero before the launch."""
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    tl.store(partial_ptr + (split * tiles + tile).to(tl.int64) * (ROWS * COLS) + offs, acc)
    last = draws_last(counter_ptr, tile, splits)
    total = tl.zeros([ROWS, COLS], tl.float32)
    if last:
        for s in range(splits):
            # .cg: straight from L2, where the other programs' stores are
            total += tl.load(
                partial_ptr + (s * tiles + tile).to(tl.int64) * (ROWS * COLS) + offs, cache_modifier=".cg"
            )
        reset_ticket(counter_ptr, tile)
    return last, total


@triton.jit
def store_gemv_rows(y, y_ptr, b_ptr, rows, rn, N, HAS_BIAS: tl.constexpr):
    """A GEMV's fp32 outputs y [BLOCK_N] for weight rows rn (rows: rn clamped to N - 1), bias added, stored
    in y's dtype; rows past N are not stored."""
    if HAS_BIAS:
        y += tl.load(b_ptr + rows).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def finish_swapped_tile(
    acc, y_ptr, stride_y, rm, rn, M, N, b_ptr, bias_rows, partial_ptr, counter_ptr, tile, splits,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """The epilogue of a swap-AB skinny GEMM whose grid is (tiles, splits): acc, fp32 [BLOCK_N, BLOCK_M]
    of weight rows rn by activation rows rm, summed over the splits (split_total) when SPLIT, then
    stored by the program holding the total into y [M, N] (row stride stride_y) in y's dtype, with
    bias [N] read at bias_rows (rn clamped to N - 1) added, where rm < M and rn < N."""
    write = True
    if SPLIT:
        write, acc = split_total(
            acc,
            partial_ptr,
            counter_ptr,
            tile,
            tl.program_id(1),
            tl.num_programs(0),
            splits,
            BLOCK_N,
            BLOCK_M,
        )
    if HAS_BIAS:
        acc += tl.load(b_ptr + bias_rows).to(tl.float32)[:, None]
    y_ptrs = y_ptr + rm[None, :].to(tl.int64) * stride_y + rn[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rm[None, :] < M) & (rn[:, None] < N) & write)
