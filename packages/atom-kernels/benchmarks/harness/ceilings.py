"""The device's ceilings, measured in the same run as each benchmark: copy bandwidth and the bf16 matmul rate."""

from __future__ import annotations

from functools import cache, partial

import torch
import triton


@cache
def measure_ceilings(device: torch.device | str = "cuda") -> tuple[float, float]:
    """(copy bandwidth in bytes/s counting read + write, bf16 matmul FLOP/s), measured once a process
    (median ms): a benchmark and the runner that records it share one measurement."""
    src = torch.randn(2**29, device=device, dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    copy_bw = (
        2 * src.numel() * 2 / (triton.testing.do_bench(partial(dst.copy_, src), return_mode="median") * 1e-3)
    )
    del src, dst
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    mm = 2 * 8192**3 / (triton.testing.do_bench(partial(torch.matmul, a, b), return_mode="median") * 1e-3)
    return copy_bw, mm
