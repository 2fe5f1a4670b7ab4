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


def row_index(rows: list[int], device: torch.device | str, length: int) -> slice | torch.Tensor:
    """rows as an index of the first dimension of a tensor of `length` rows: a slice (a view, nothing
    copied) when they are 0, 1, ..., n - 1, else an int64 tensor on device. Rows past the end raise
    here, as a tensor index would (a slice would cut them off silently)."""
    if rows and not -length <= min(rows) <= max(rows) < length:
        bad = next(r for r in rows if not -length <= r < length)
        raise IndexError(f"row index {bad} is out of range for {length} rows")
    if rows == list(range(len(rows))):
        return slice(0, len(rows))
    return to_device(rows, torch.long, device)


def host_to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """host (a CPU tensor the caller no longer writes) on device, copied without waiting for the device's
    queued work."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class PendingRead:
    """A device tensor's copy to the host, started at once without waiting (pinned, non-blocking), and
    read later: the work queued after it runs on while the host waits for this copy alone. On the CPU the
    tensor itself."""

    def __init__(self, values: torch.Tensor):
        self.done: torch.cuda.Event | None = None
        self.host = values
        if values.is_cuda:
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record(torch.cuda.current_stream(values.device))

    def tolist(self) -> list:
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()
