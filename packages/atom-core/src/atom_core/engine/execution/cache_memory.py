"""How much memory the engine may take, and how many KV blocks that leaves once the weights are loaded and
the state rows the plan needs are set aside.

gpu_memory_utilization means what vLLM's does: the share of the device's total memory this engine may
use, weights and caches together. It is checked when the engine starts (before anything is loaded), so two
engines on one device each ask for their own share, and one that asks for more than is free is refused
by name instead of running out of memory later."""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from atom_core.cache import bytes_per_block, bytes_per_slot
from atom_core.cache.specs import CacheSpec
from atom_core.config import CacheConfig

CPU_KV_BYTES = 1 << 30  # the caches' share of host memory when none is given
GIB = 1 << 30


def release_cached_memory(device: torch.device) -> None:
    """Return the memory of tensors nothing refers to any more (an engine shut down or dropped, still in a
    reference cycle) from PyTorch's caching allocator to the device, so it counts as free."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class MemoryBudget:
    """What the engine may take of one device: `requested` bytes in all, measured from `free_at_start`
    (the device's free bytes before the engine allocated anything). None of it on the CPU."""

    requested: int
    free_at_start: int

    @classmethod
    def at_start(cls, device: torch.device, fraction: float) -> MemoryBudget | None:
        """The budget of an engine starting now on `device` (None on the CPU): fraction x the device's
        total memory, refused when less than that is free."""
        if device.type != "cuda":
            return None
        release_cached_memory(device)
        free, total = torch.cuda.mem_get_info(device)
        requested = math.ceil(total * fraction)
        if free < requested:
            raise ValueError(
                f"gpu_memory_utilization {fraction} asks for {requested / GIB:.1f} GiB of {device}'s "
                f"{total / GIB:.1f} GiB, but only {free / GIB:.1f} GiB are free (other engines or "
                "processes hold the rest): lower it, or free the device"
            )
        return cls(requested=requested, free_at_start=free)

    def left(self, device: torch.device) -> int:
        """Bytes of the budget not yet taken: what the engine has allocated since it started (the weights,
        everything PyTorch's allocator holds for it) comes off the request."""
        free, _ = torch.cuda.mem_get_info(device)
        return self.requested - (self.free_at_start - free)


def blocks_that_fit(
    state_rows: int,
    *,
    paged_specs: Sequence[CacheSpec],
    state_specs: Sequence[CacheSpec],
    cache: CacheConfig,
    dtype: torch.dtype,
    device: torch.device,
    budget: MemoryBudget | None,
    group: dist.ProcessGroup | None = None,
) -> int:
    """Blocks of every paged layer in paged_specs (the target's and its draft's) that fit, after state_rows
    rows of state_specs' layers, in what is left of the engine's budget (CPU_KV_BYTES on the CPU). With a
    tensor-parallel control group every rank gets the fewest any rank fits (they must hold the same
    count)."""
    per_block = bytes_per_block(paged_specs, cache, dtype=dtype, device=device)
    available = CPU_KV_BYTES if budget is None else budget.left(device)
    available -= state_rows * bytes_per_slot(state_specs, dtype=dtype)
    if per_block == 0:  # no paged layers: the block tables address nothing, one block will do
        return 1
    blocks = available // per_block
    if group is not None:
        agreed = torch.tensor([blocks])
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=group)
        blocks = int(agreed)
    if blocks < 1:
        raise RuntimeError(
            f"the KV cache does not fit: one block of {cache.block_size} tokens needs {per_block} bytes, "
            f"{max(available, 0)} are left of gpu_memory_utilization's share once the weights are loaded "
            "(raise gpu_memory_utilization, or lower max_num_seqs or the model's size)"
        )
    return blocks
