"""One-shot all-reduce over peer memory, for decode's small messages (tensor parallelism on one host).

Every rank can address every rank's symmetric buffer (CUDA IPC: torch's symmetric memory). Each program
copies its chunks of the input into its rank's buffer, meets the same program on every other rank at a
barrier of flags, reads and sums all ranks' copies of its chunks over NVLink, then meets them again so that
no rank overwrites its copy (in the next call) while a peer still reads it. One launch and no host
involvement, so it captures in CUDA graphs; NCCL stays the path for large messages, where its ring wins.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Each program's flags are its own slots in the pads, and every program of the grid must be resident at
# once (a program spins until its peers' same program arrives): 512 small programs fit a Hopper GPU's
# SMs many times over. Many programs, one chunk each, keep many remote loads in flight: one program looping
# over chunks pays NVLink's latency per chunk.
MAX_PROGRAMS = 512
SMALL_MESSAGE = 8192  # elements: up to here blocks of 2048 elements a program, beyond 256
PAD_SLOTS_PER_RANK = 2 * MAX_PROGRAMS  # int32 flags a rank's pad holds per peer: start and end barriers


def pad_slots(world: int) -> int:
    """int32 flags one rank's pad needs (zeroed before first use; every call leaves them zero)."""
    return PAD_SLOTS_PER_RANK * world


@triton.jit
def _meet(pads, slot, rank, WORLD: tl.constexpr):
    """Barrier of this program with the same program on every rank. Raise our flag in each rank's pad at
    slot + rank (a release store: our copies before it are visible), then wait for every rank's flag in
    ours and lower it (acquire). Each flag is raised once per meeting and lowered before its owner can
    meet at the same slot again, so raising needs no wait."""
    for peer in tl.static_range(WORLD):
        pad = tl.load(pads + peer).to(tl.pointer_type(tl.int32))
        tl.atomic_xchg(pad + slot + rank, 1, sem="release", scope="sys")
    own = tl.load(pads + rank).to(tl.pointer_type(tl.int32))
    for peer in tl.static_range(WORLD):
        while tl.atomic_cas(own + slot + peer, 1, 0, sem="acquire", scope="sys") != 1:
            pass


@triton.jit
def _one_shot_kernel(
    x_ptr,
    out_ptr,
    buffers,
    pads,
    n,
    rank,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    dtype = x_ptr.dtype.element_ty
    mine = tl.load(buffers + rank).to(tl.pointer_type(dtype))
    for start in range(pid * BLOCK, n, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(mine + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
    tl.debug_barrier()  # every thread's copy is issued before the flag that publishes it
    _meet(pads, pid * 2 * WORLD, rank, WORLD)
    tl.debug_barrier()
    for start in range(pid * BLOCK, n, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for peer in tl.static_range(WORLD):
            src = tl.load(buffers + peer).to(tl.pointer_type(dtype))
            # .cg: past L1, which may hold this address from the last call (peer writes do not
            # invalidate it); vectorized, unlike a volatile load
            acc += tl.load(src + offs, mask=mask, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    tl.debug_barrier()  # every thread has read the peers' copies before we release them
    _meet(pads, pid * 2 * WORLD + WORLD, rank, WORLD)


def one_shot_all_reduce(
    x: torch.Tensor,
    buffers: torch.Tensor,
    pads: torch.Tensor,
    rank: int,
    *,
    out: torch.Tensor | None = None,
    block: int | None = None,
    programs: int | None = None,
) -> torch.Tensor:
    """Sum of x over all ranks -> out (x's shape and dtype; fp32 accumulation, in rank order).

    x: contiguous, any shape; buffers: int64 [world] addresses of each rank's symmetric buffer (at least
    x.nbytes each, this rank's at [rank]); pads: int64 [world] addresses of each rank's flag pad
    (pad_slots(world) int32, zero). Every rank must call it with the same shape, block and programs, in
    the same order relative to its other calls on these buffers.
    """
    if not x.is_contiguous():
        raise ValueError("one_shot_all_reduce needs a contiguous input")
    world = buffers.numel()
    if pads.numel() != world or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world} buffers and {pads.numel()} pads")
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    if block is None:  # (bench_all_reduce.py --sweep, two GPUs): one big tile for a row, then small ones
        block = 2048 if n <= SMALL_MESSAGE else 256
    if programs is None:
        programs = min(MAX_PROGRAMS, triton.cdiv(n, block))
    if not 1 <= programs <= MAX_PROGRAMS:
        raise ValueError(f"programs must be in [1, {MAX_PROGRAMS}], got {programs}")
    if n:
        _one_shot_kernel[(programs,)](
            x, out, buffers, pads, n, rank, WORLD=world, BLOCK=block, num_warps=min(16, max(4, block // 256)),
        )  # fmt: skip
    return out


def all_reduce_ref(xs: list[torch.Tensor]) -> torch.Tensor:
    """The sum in fp32, in rank order, cast to x's dtype: what one_shot_all_reduce gives on each rank."""
    acc = torch.zeros_like(xs[0], dtype=torch.float32)
    for x in xs:
        acc += x.float()
    return acc.to(xs[0].dtype)
