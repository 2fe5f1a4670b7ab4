"""The engine's all-reduces over peer memory: atom-kernels' one-shot kernel, and the sum fused with the
residual add and RMSNorm after it.

A decode step all-reduces twice a layer, a few KB to a few hundred KB each, and each sum is followed by
the residual add and a norm. The decoder layers hand those sums to their norms (layers/parallel.py's
RankPartial), which run `all_reduce_rms_norm` here: at one row in half the time of NCCL and the norm
kernel (atom-kernels' bench_all_reduce.py). Other small messages take the one-shot kernel;
larger ones NCCL. Built once per rank, collectively, before the CUDA graphs are captured: the kernels and
their buffer addresses are then part of every graph.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist

from atom_core.config import ParallelConfig
from atom_core.ops import (
    PEER_NORM_MAX_ROWS,
    all_reduce_rms_norm,
    fused_buffer_bytes,
    one_shot_all_reduce,
    peer_pad_slots,
)

logger = logging.getLogger("atom_core.engine")

# In CUDA graphs of back-to-back calls the kernel beat NCCL up to 2 MB (bench_all_reduce.py), but inside
# the engine's decode steps NCCL's all-reduce is faster than there, and with peer all-reduces up to 2 MB a
# B=64 step was no faster. So the peer path takes decode up to B = 32 at hidden 4096 in bf16.
DEFAULT_MAX_BYTES = 256 << 10
# The sum fused with the norm after it was ahead of NCCL + the norm kernel at every size
# bench_all_reduce.py timed (to 2 MB) and in the engine's steps to B=64 (512 KB at hidden 4096).
DEFAULT_FUSED_MAX_BYTES = 1 << 20
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# torch's symmetric memory keeps per-process state for a group name past the group's end: a second TP
# engine in one process (a new group of the same name) waited forever in its rendezvous.
# So a process rendezvouses once; a later engine in it uses NCCL (all ranks agree, see below).
_rendezvous_done = False


class PeerAllReduce:
    """Sums a tensor over the group's ranks through a buffer every rank can address (torch's symmetric
    memory: CUDA IPC), for contiguous CUDA tensors of at most max_bytes; `takes(x)` says which. Also the
    sum fused with the residual add and RMSNorm after it (`rms_norm`, where `takes_rows(x)`), over a
    buffer of its own: two halves of every rank's rows of up to fused_max_bytes, each word tagged with a
    count."""

    def __init__(
        self,
        group,
        device: torch.device,
        max_bytes: int = DEFAULT_MAX_BYTES,
        fused_max_bytes: int = DEFAULT_FUSED_MAX_BYTES,
    ):
        import torch.distributed._symmetric_memory as symm_mem

        global _rendezvous_done
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.max_bytes, self.fused_max_bytes = max_bytes, fused_max_bytes
        pad_bytes = peer_pad_slots(self.world) * 4
        # One symmetric allocation per rank: the one-shot kernel's data buffer and barrier flags (zero at
        # rest), then the fused kernel's tagged words (zero at first use).
        fused_at = max_bytes + pad_bytes
        total = fused_at + fused_buffer_bytes(self.world, fused_max_bytes)
        self._storage = symm_mem.empty(total, dtype=torch.uint8, device=device)
        self._storage[max_bytes:].zero_()
        handle = symm_mem.rendezvous(self._storage, group.group_name)
        _rendezvous_done = True
        bases = [int(p) for p in handle.buffer_ptrs]
        self.buffers = torch.tensor(bases, dtype=torch.int64, device=device)
        self.pads = torch.tensor([b + max_bytes for b in bases], dtype=torch.int64, device=device)
        self.fused_buffers = torch.tensor([b + fused_at for b in bases], dtype=torch.int64, device=device)
        self.fused_counts = torch.zeros(PEER_NORM_MAX_ROWS, dtype=torch.int64, device=device)
        self.fused_width: int | None = None  # every fused call on these buffers has one row width
        torch.cuda.synchronize(device)  # every rank's flags are zero before any rank raises one
        dist.barrier(group=group)

    def takes(self, x: torch.Tensor) -> bool:
        return x.is_cuda and x.is_contiguous() and x.dtype in DTYPES and x.nbytes <= self.max_bytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: this rank's part, any shape -> the sum over ranks (a new tensor, x's shape and dtype)."""
        return one_shot_all_reduce(x, self.buffers, self.pads, self.rank)

    def takes_rows(self, x: torch.Tensor) -> bool:
        """Whether rms_norm takes x's rows: [T, H] of at most fused_max_bytes, T up to the kernel's
        program count, H even (16-bit rows go in 4-byte words) and the width of the first fused call
        (every rank decides the same, from the same calls)."""
        if not (x.is_cuda and x.is_contiguous() and x.dtype in DTYPES and x.dim() == 2):
            return False
        if x.nbytes > self.fused_max_bytes or x.shape[0] > PEER_NORM_MAX_ROWS or x.shape[1] % 2:
            return False
        if self.fused_width is None:
            self.fused_width = x.shape[1]
        return x.shape[1] == self.fused_width

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor,
        *,
        weight_offset: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: this rank's partial [T, H] -> (rms_norm(sum + residual), sum + residual), as the sum over
        ranks followed by the RMSNorm kernel gives them, in one launch."""
        return all_reduce_rms_norm(
            x,
            weight,
            eps,
            residual.contiguous(),
            buffers=self.fused_buffers,
            counts=self.fused_counts,
            half_bytes=self.fused_max_bytes,
            rank=self.rank,
            weight_offset=weight_offset,
        )


def peers_reachable(world: int) -> bool:
    """Whether every GPU of the group can address every other's memory (NVLink or PCIe P2P)."""
    return all(torch.cuda.can_device_access_peer(a, b) for a in range(world) for b in range(world) if a != b)


def with_peer_all_reduce(parallel: ParallelConfig, device: torch.device, enabled: bool) -> ParallelConfig:
    """parallel with a PeerAllReduce for its small all-reduces, where tensor parallelism runs on GPUs
    that reach each other's memory; else parallel as given (NCCL for every all-reduce). Collective: every
    rank calls it at the same point, and decides the same way (the checks read only the host's GPUs)."""
    if not enabled or parallel.tp_size == 1 or device.type != "cuda":
        return parallel
    if not peers_reachable(parallel.tp_size):
        logger.info("GPUs without peer access to each other: every all-reduce goes through NCCL")
        return parallel
    # every rank must take the same path: a fresh worker beside a rank 0 that ran an engine before
    fresh = torch.tensor([0 if _rendezvous_done else 1], device=device)
    dist.all_reduce(fresh, op=dist.ReduceOp.MIN, group=parallel.group)
    if not int(fresh):
        logger.info("a tensor-parallel engine ran in this process before: every all-reduce goes through NCCL")
        return parallel
    peer = PeerAllReduce(parallel.group, device)
    return dataclasses.replace(parallel, peer_all_reduce=peer)
