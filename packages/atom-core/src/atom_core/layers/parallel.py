"""Tensor-parallel collectives (no-ops at tp_size 1)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from atom_core.config import ParallelConfig


def all_reduce(x: torch.Tensor, parallel: ParallelConfig) -> torch.Tensor:
    """x summed over the tensor-parallel ranks: the peer-memory kernel for the small messages it takes
    (a new tensor), else NCCL in place. Use the returned tensor."""
    if parallel.tp_size == 1:
        return x
    peer = parallel.peer_all_reduce
    if peer is not None and peer.takes(x):
        return peer(x)
    dist.all_reduce(x, group=parallel.group)
    return x


def all_gather_last_dim(x: torch.Tensor, parallel: ParallelConfig) -> torch.Tensor:
    if parallel.tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(parallel.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=parallel.group)
    return torch.cat(parts, dim=-1)
