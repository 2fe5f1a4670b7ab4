"""How many KV blocks the memory left for caches holds, once the state rows the plan needs are set aside."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from atom_core.cache import bytes_per_block, bytes_per_slot
from atom_core.cache.specs import CacheSpec
from atom_core.config import CacheConfig

CPU_KV_BYTES = 1 << 30  # the caches' share of host memory when none is given


def blocks_that_fit(
    paged_specs: Sequence[CacheSpec],
    state_specs: Sequence[CacheSpec],
    cache: CacheConfig,
    *,
    dtype: torch.dtype,
    device: torch.device,
    fraction: float,
    state_rows: int,
) -> int:
    """Blocks of every paged layer in paged_specs (the target's and its draft's) that fit, after state_rows
    rows of state_specs' layers, in what is left of `fraction` of the device's total memory once the memory
    in use now (the weights, anything else on the device) is counted, as vLLM's gpu_memory_utilization
    means it (CPU_KV_BYTES on the CPU)."""
    per_block = bytes_per_block(paged_specs, cache, dtype=dtype, device=device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        available = int(total * fraction) - (total - free)
        if available <= 0:
            gib = 1 << 30
            raise ValueError(
                f"gpu_memory_utilization {fraction} allows {total * fraction / gib:.1f} GiB of the device's "
                f"{total / gib:.1f} GiB, but {(total - free) / gib:.1f} GiB are in use already (weights and "
                "other processes): raise it, or free the device"
            )
    else:
        available = CPU_KV_BYTES
    available -= state_rows * bytes_per_slot(state_specs, dtype=dtype)
    if per_block == 0:  # no paged layers: the block tables address nothing, one block will do
        return 1
    blocks = available // per_block
    if blocks < 1:
        raise RuntimeError(
            f"the KV cache does not fit: one block of {cache.block_size} tokens needs {per_block} bytes, "
            f"{available} are available"
        )
    return blocks
