"""Output tensors of the ops that write rows like their input."""

from __future__ import annotations

import torch


def rows_like(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """out, checked to be x's shape and dtype with a contiguous last dim (the kernels store rows), or a
    new contiguous tensor like x."""
    if out is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    if out.shape != x.shape or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be {list(x.shape)} {x.dtype} with a contiguous last dim")
    return out
