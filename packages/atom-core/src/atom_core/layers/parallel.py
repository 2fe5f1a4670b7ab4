"""Tensor-parallel collectives (no-ops at tp_size 1)."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class RankPartial:
    """This rank's share of a sum over the tensor-parallel ranks, not yet reduced. A mixer or MLP whose
    output reduction is deferred (`defer_output_reduce`) returns it, and the RMSNorm after it reduces it:
    in the same launch as the residual add and the norm where the engine's peer all-reduce takes it."""

    partial: torch.Tensor
    parallel: ParallelConfig

    def reduce(self) -> torch.Tensor:
        return all_reduce(self.partial, self.parallel)


def add_sums(a: torch.Tensor | RankPartial, b: torch.Tensor | RankPartial) -> torch.Tensor | RankPartial:
    """a + b, either of them possibly unreduced: two partials stay one partial (one reduction for both,
    as a MoE block's routed and shared experts need); a partial beside a reduced tensor is reduced."""
    if isinstance(a, RankPartial) and isinstance(b, RankPartial):
        return RankPartial(a.partial + b.partial, a.parallel)
    a = a.reduce() if isinstance(a, RankPartial) else a
    return a + (b.reduce() if isinstance(b, RankPartial) else b)


def may_defer_reduce(parallel: ParallelConfig) -> bool:
    """Whether a reduction over ranks is worth handing to the next norm: only the engine's peer
    all-reduce fuses with it (NCCL and the adapters' engines reduce as before)."""
    return parallel.tp_size > 1 and parallel.peer_all_reduce is not None


def defer_reductions_to_norms(*blocks) -> None:
    """A decoder layer's mixer and MLP, each followed by an RMSNorm: each block that can returns its
    output unreduced (a RankPartial) for that norm to reduce. A block without `defer_output_reduce`
    keeps reducing its own output."""
    for block in blocks:
        if hasattr(block, "defer_output_reduce"):
            block.defer_output_reduce()


def all_gather_last_dim(x: torch.Tensor, parallel: ParallelConfig) -> torch.Tensor:
    if parallel.tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(parallel.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=parallel.group)
    return torch.cat(parts, dim=-1)
