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
    """Blocks of every paged layer in paged_specs (the target's and its draft's) that fit in `fraction` of
    the device's free memory (CPU_KV_BYTES on the CPU), after state_rows rows of state_specs' layers."""
    per_block = bytes_per_block(paged_specs, cache, dtype=dtype, device=device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        available = int(free * fraction)
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
