"""The one-shot all-reduce kernel across ranks: on the CPU, each rank is a forked process running the
kernel under the Triton interpreter over shared-memory buffers (the same addresses in every process, as
symmetric memory gives on GPUs), so its barriers really wait for the other ranks. On two GPUs the same
kernel runs over CUDA IPC memory (atom-core's TP engine test)."""

import pytest
import torch

from atom_kernels.comm import MAX_PROGRAMS, all_reduce_ref, one_shot_all_reduce, pad_slots

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the forked-ranks harness is the CPU's")


def _ranks(forked_ranks, world: int, sizes, dtype, block: int | None, programs: int | None, calls: int = 2):
    """Run `calls` all-reduces per size on `world` forked ranks -> (inputs, outputs, pads after)."""
    largest = max(sizes)
    bufs = [torch.full((largest,), float("nan"), dtype=dtype).share_memory_() for _ in range(world)]
    pads = [torch.zeros(pad_slots(world), dtype=torch.int32).share_memory_() for _ in range(world)]
    buffers = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64)
    gen = torch.Generator().manual_seed(world * 100 + len(sizes))
    xs = {(r, n): torch.randn(n, generator=gen).to(dtype) * (r + 1) for r in range(world) for n in sizes}
    outs = {(r, n): torch.zeros(n, dtype=dtype).share_memory_() for r in range(world) for n in sizes}

    def rank_main(r):
        for n in sizes:
            for _ in range(calls):  # the next call reuses the buffers and flags the last one left
                one_shot_all_reduce(
                    xs[r, n], buffers, pad_ptrs, r, out=outs[r, n], block=block, programs=programs
                )

    forked_ranks(world, rank_main)
    return xs, outs, pads


@pytest.mark.parametrize(
    "world, sizes, dtype, block, programs",
    [
        (2, [1, 300, 4096], torch.float16, 256, None),  # programs from the size; ragged tails
        (2, [5000, 9000], torch.float16, None, None),  # the default tiles on both sides of their switch
        (3, [1000, 77], torch.float32, 128, 3),  # fewer programs than blocks: each loops over its chunks
        (2, [2048], torch.float16, 64, MAX_PROGRAMS),  # every program slot (bf16: the GPU test; the
        # interpreter truncates bf16 casts)
    ],
)
def test_every_rank_gets_the_sum_and_the_flags_end_lowered(
    forked_ranks, world, sizes, dtype, block, programs
):
    xs, outs, pads = _ranks(forked_ranks, world, sizes, dtype, block, programs)
    for n in sizes:
        expected = all_reduce_ref([xs[r, n] for r in range(world)])
        for r in range(world):
            torch.testing.assert_close(outs[r, n], expected, rtol=0, atol=0)
    assert all(int(p.abs().sum()) == 0 for p in pads)


def test_bad_arguments_are_refused():
    x = torch.zeros(8)
    two = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="contiguous"):
        one_shot_all_reduce(torch.zeros(4, 4).T, two, two, 0)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        one_shot_all_reduce(x, two, two, 2)
    with pytest.raises(ValueError, match="programs must be in"):
        one_shot_all_reduce(x, two, two, 0, programs=MAX_PROGRAMS + 1)
