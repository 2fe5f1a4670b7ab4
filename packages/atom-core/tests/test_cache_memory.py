"""engine/execution/cache_memory.py: gpu_memory_utilization as vLLM means it. The KV cache gets what the
memory in use (weights, other processes) leaves of that share of the device's total memory; a share
below what is in use is refused by name. The device's memory is faked: only the arithmetic is tested."""

import pytest
import torch

from atom_core.cache.specs import PagedKVSpec
from atom_core.config import CacheConfig
from atom_core.engine.execution import cache_memory

GIB = 1 << 30
SPECS = [PagedKVSpec(num_kv_heads=8, head_dim=128)] * 4  # 4 layers: 2 x 16 x 8 x 128 x 2 B = 64 KiB each


def _fit(monkeypatch, free: int, total: int, fraction: float) -> int:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    return cache_memory.blocks_that_fit(
        SPECS,
        [],
        CacheConfig(block_size=16),
        dtype=torch.bfloat16,
        device=torch.device("cuda", 0),
        fraction=fraction,
        state_rows=0,
    )


def test_the_kv_cache_takes_what_is_in_use_off_the_share_of_total_memory(monkeypatch):
    per_block = 4 * 2 * 16 * 8 * 128 * 2
    # 100 GiB device, 40 GiB in use: 0.9 of it allows 90 GiB, 50 GiB are left for the cache
    assert _fit(monkeypatch, free=60 * GIB, total=100 * GIB, fraction=0.9) == 50 * GIB // per_block
    # (the old reading, 0.9 of the free 60 GiB, would have given 54 GiB)
    assert _fit(monkeypatch, free=100 * GIB, total=100 * GIB, fraction=0.5) == 50 * GIB // per_block


def test_a_share_below_the_memory_in_use_is_refused_by_name(monkeypatch):
    with pytest.raises(
        ValueError, match=r"gpu_memory_utilization 0.3 allows 30.0 GiB .* 40.0 GiB are in use"
    ):
        _fit(monkeypatch, free=60 * GIB, total=100 * GIB, fraction=0.3)
