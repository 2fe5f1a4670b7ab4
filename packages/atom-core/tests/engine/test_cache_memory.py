"""engine/execution/cache_memory.py: gpu_memory_utilization as vLLM means it. An engine asks for that share
of the device's total memory when it starts (refused by name when less is free), and its KV cache gets
what its own weights leave of it; memory other engines or processes hold does not shrink it further.
The device's memory is faked: only the arithmetic is tested (the GPU suite frees and reuses it for real)."""

import pytest
import torch

from atom_core.cache.specs import PagedKVSpec
from atom_core.config import CacheConfig
from atom_core.engine.execution import cache_memory
from atom_core.engine.execution.cache_memory import MemoryBudget

GIB = 1 << 30
CUDA = torch.device("cuda", 0)
SPECS = [PagedKVSpec(num_kv_heads=8, head_dim=128)] * 4  # 4 layers: 2 x 16 x 8 x 128 x 2 B = 64 KiB each
PER_BLOCK = 4 * 2 * 16 * 8 * 128 * 2


class FakeDevice:
    """torch.cuda's memory queries over a device of `total` bytes with `used` of them taken."""

    def __init__(self, monkeypatch, total: int, used: int):
        self.total, self.used, self.emptied = total, used, 0
        monkeypatch.setattr(
            torch.cuda, "mem_get_info", lambda device=None: (self.total - self.used, self.total)
        )
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)

    def empty_cache(self):
        self.emptied += 1


def _fit(budget: MemoryBudget) -> int:
    return cache_memory.blocks_that_fit(
        0,
        paged_specs=SPECS,
        state_specs=[],
        cache=CacheConfig(block_size=16),
        dtype=torch.bfloat16,
        device=CUDA,
        budget=budget,
    )


def test_the_kv_cache_takes_what_the_engines_own_weights_leave_of_its_share(monkeypatch):
    device = FakeDevice(monkeypatch, total=100 * GIB, used=30 * GIB)  # another process holds 30 GiB
    budget = MemoryBudget.at_start(CUDA, 0.5)
    assert device.emptied == 1  # what dropped engines left in PyTorch's cache counted as free first
    assert (budget.requested, budget.free_at_start) == (50 * GIB, 70 * GIB)
    device.used += 20 * GIB  # the weights
    assert _fit(budget) == 30 * GIB // PER_BLOCK  # 50 asked, 20 taken: the other process's 30 do not count


def test_two_engines_on_one_device_each_get_their_own_share(monkeypatch):
    device = FakeDevice(monkeypatch, total=100 * GIB, used=0)
    first = MemoryBudget.at_start(CUDA, 0.4)
    device.used += 40 * GIB  # the first engine's weights and cache
    second = MemoryBudget.at_start(CUDA, 0.4)
    device.used += 10 * GIB
    assert _fit(second) == 30 * GIB // PER_BLOCK
    assert first.requested == second.requested == 40 * GIB


def test_a_share_larger_than_the_free_memory_is_refused_at_start_by_name(monkeypatch):
    FakeDevice(monkeypatch, total=100 * GIB, used=40 * GIB)
    with pytest.raises(
        ValueError,
        match=r"^gpu_memory_utilization 0.9 asks for 90.0 GiB of cuda:0's 100.0 GiB, but only 60.0 GiB are "
        r"free \(other engines or processes hold the rest\): lower it, or free the device$",
    ):
        MemoryBudget.at_start(CUDA, 0.9)


def test_weights_that_take_the_whole_share_leave_no_cache_and_say_so(monkeypatch):
    device = FakeDevice(monkeypatch, total=100 * GIB, used=0)
    budget = MemoryBudget.at_start(CUDA, 0.2)
    device.used += 25 * GIB  # weights larger than the share
    with pytest.raises(RuntimeError, match=r"0 are left of gpu_memory_utilization's share"):
        _fit(budget)


def test_the_cpu_has_no_budget_and_a_fixed_cache():
    assert MemoryBudget.at_start(torch.device("cpu"), 0.9) is None
    blocks = cache_memory.blocks_that_fit(
        0,
        paged_specs=SPECS,
        state_specs=[],
        cache=CacheConfig(block_size=16),
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        budget=None,
    )
    assert blocks == cache_memory.CPU_KV_BYTES // PER_BLOCK
