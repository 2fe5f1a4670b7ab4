"""The all-reduce fused with the residual add and RMSNorm, across ranks: on the CPU each rank is a forked
process running the kernel under the Triton interpreter over shared-memory buffers (the same addresses in
every process, as symmetric memory gives on GPUs), so its barrier really waits for the other ranks. On two
GPUs the same kernel runs over CUDA IPC memory (atom-core's TP engine test)."""

import pytest
import torch

from atom_kernels.comm import (
    MAX_ROWS,
    all_reduce_ref,
    all_reduce_rms_norm,
    all_reduce_rms_norm_ref,
    fused_buffer_bytes,
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the forked-ranks harness is the CPU's")


def _ranks(forked_ranks, world: int, calls, hidden: int, dtype, half_bytes: int):
    """Run the calls [(rows, with_residual, weight_offset)] in order on `world` forked ranks ->
    (inputs, outputs, counts after)."""
    size = fused_buffer_bytes(world, half_bytes)
    bufs = [torch.zeros(size, dtype=torch.uint8).share_memory_() for _ in range(world)]
    counts = [torch.zeros(MAX_ROWS, dtype=torch.int64).share_memory_() for _ in range(world)]
    buffers = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    gen = torch.Generator().manual_seed(world * 100 + len(calls))
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    xs = {
        (r, i): torch.randn(rows, hidden, generator=gen).to(dtype) * (r + 1)
        for r in range(world)
        for i, (rows, _, _) in enumerate(calls)
    }
    residuals = {
        i: torch.randn(rows, hidden, generator=gen).to(dtype) for i, (rows, _, _) in enumerate(calls)
    }
    outs = {
        (r, i, j): torch.zeros(rows, hidden, dtype=dtype).share_memory_()
        for r in range(world)
        for i, (rows, _, _) in enumerate(calls)
        for j in range(2)
    }

    def rank_main(r):
        for i, (_, with_residual, offset) in enumerate(calls):
            y, s = all_reduce_rms_norm(
                xs[r, i],
                weight,
                1e-5,
                residuals[i] if with_residual else None,
                buffers=buffers,
                counts=counts[r],
                half_bytes=half_bytes,
                rank=r,
                weight_offset=offset,
            )
            outs[r, i, 0].copy_(y)
            outs[r, i, 1].copy_(s)

    forked_ranks(world, rank_main)
    return weight, xs, residuals, outs, counts


@pytest.mark.parametrize(
    "world, calls, hidden, dtype",
    [
        # the same rows three times (each half of the buffers twice), then fewer and more rows: a program
        # keeps its own count, so calls of different row counts interleave
        (2, [(3, True, 0.0)] * 3 + [(1, True, 1.0), (5, False, 0.0), (1, True, 0.0)], 96, torch.float16),
        (3, [(2, True, 0.0), (4, False, 1.0), (2, True, 0.0)], 40, torch.float32),  # ragged width, 3 ranks
    ],
)
def test_every_rank_gets_the_normalized_sum_and_the_new_residual(forked_ranks, world, calls, hidden, dtype):
    """Every rank gets the same rows: the sum exactly the one-shot all-reduce's, the normalized row the
    torch reference's within the RMSNorm kernel's own tolerance."""
    weight, xs, residuals, outs, counts = _ranks(forked_ranks, world, calls, hidden, dtype, half_bytes=4096)
    tol = {torch.float32: 1e-6, torch.float16: 1e-3}[dtype]
    for i, (_, with_residual, offset) in enumerate(calls):
        parts, residual = [xs[r, i] for r in range(world)], residuals[i] if with_residual else None
        y, s = all_reduce_rms_norm_ref(parts, weight, 1e-5, residual, offset)
        total = all_reduce_ref(parts)
        torch.testing.assert_close(s, total if residual is None else total + residual, rtol=0, atol=0)
        for r in range(world):
            torch.testing.assert_close(outs[r, i, 0], outs[0, i, 0], rtol=0, atol=0)
            torch.testing.assert_close(outs[r, i, 1], s, rtol=0, atol=0)
        torch.testing.assert_close(outs[0, i, 0], y, rtol=tol, atol=tol)
    # each program counted the calls it served
    served = [sum(1 for rows, _, _ in calls if rows > p) for p in range(MAX_ROWS)]
    for r in range(world):
        assert counts[r].tolist() == served


def test_bad_arguments_are_refused():
    x = torch.zeros(2, 8)
    two = torch.zeros(2, dtype=torch.int64)
    counts = torch.zeros(MAX_ROWS, dtype=torch.int64)
    common = dict(buffers=two, counts=counts, half_bytes=64, rank=0)
    w = torch.ones(8)
    with pytest.raises(ValueError, match="contiguous"):
        all_reduce_rms_norm(torch.zeros(8, 2).T, w, 1e-5, None, **common)
    with pytest.raises(ValueError, match="even width"):
        all_reduce_rms_norm(torch.zeros(2, 7, dtype=torch.float16), w[:7], 1e-5, None, **common)
    with pytest.raises(ValueError, match="weight must be"):
        all_reduce_rms_norm(x, torch.ones(4), 1e-5, None, **common)
    with pytest.raises(ValueError, match="residual must be"):
        all_reduce_rms_norm(x, w, 1e-5, torch.zeros(2, 8, dtype=torch.float16), **common)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        all_reduce_rms_norm(x, w, 1e-5, None, **{**common, "rank": 2})
    with pytest.raises(ValueError, match="exceed the buffers"):
        all_reduce_rms_norm(torch.zeros(3, 8), w, 1e-5, None, **common)
    with pytest.raises(ValueError, match="counts must be int64"):
        all_reduce_rms_norm(x, w, 1e-5, None, **{**common, "counts": counts.int()})
