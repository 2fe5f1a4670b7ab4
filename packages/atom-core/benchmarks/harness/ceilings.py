"""The device's ceilings, measured once a process: a benchmark and the runner that records it share them."""

from __future__ import annotations

import time
from functools import cache

import torch


@cache
def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy, read + write."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 20 / (time.perf_counter() - start)


@cache
def matmul_rate() -> float:
    """FLOP/s of an 8192^3 bf16 matmul (median of 20)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(23):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return 2 * 8192**3 / (sorted(times[3:])[10] * 1e-3)


def measure_ceilings() -> tuple[float, float]:
    """(copy bandwidth in bytes/s, bf16 matmul FLOP/s)."""
    return copy_bandwidth(), matmul_rate()
