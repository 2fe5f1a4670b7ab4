"""Host lists to the device without waiting for it.

A copy from pageable host memory to the device first waits for the stream's earlier work, so one issued
after a forward was launched would hold the host until that forward ends: the overlap async scheduling
exists for would be lost. Values go through pinned memory (PyTorch's caching host allocator) and are
copied without blocking instead.
"""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A tensor of values on device, copied without waiting for the device's queued work."""
    return host_to_device(torch.tensor(values, dtype=dtype), device)


def host_to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """host (a CPU tensor the caller no longer writes) on device, copied without waiting for the device's
    queued work."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
