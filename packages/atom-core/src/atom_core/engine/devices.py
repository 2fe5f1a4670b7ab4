"""The device an engine runs on, resolved from what was asked for and refused by name where torch cannot
see it (torch's own error is a traceback from its first CUDA call, after the checkpoint was read)."""

from __future__ import annotations

import torch

from atom_core.config import ConfigError


def resolve_device(asked: str | None) -> torch.device:
    """asked: "cpu", "cuda" or "cuda:i"; None: cuda if torch sees a GPU, else cpu."""
    device = torch.device(asked or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        return device
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ConfigError(
            f"device {asked!r}: torch {torch.__version__} ({build}) sees no CUDA GPU here; use device 'cpu'"
        )
    if device.index is not None and device.index >= visible:
        raise ConfigError(f"device {asked!r}: torch sees {visible} GPU(s), numbered from 0")
    return device
