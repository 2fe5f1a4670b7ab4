"""RMSNorm (with the residual add fused in): one kernel per call, fp32 statistics like the reference models."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.ops import rms_norm


class RMSNorm(nn.Module):
    """offset: 1.0 for the zero-centred norms (Qwen3-Next, Qwen3.5, Gemma) that scale by (1 + weight)."""

    def __init__(self, hidden: int, eps: float, *, dtype, offset: float = 0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.full((hidden,), 1.0 - offset, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x: [..., H]. With a residual: returns (norm(x + residual), x + residual)."""
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if residual is None:
            return rms_norm(rows, self.weight, self.eps, weight_offset=self.offset).view(shape)
        y, s = rms_norm(
            rows, self.weight, self.eps, residual.reshape(-1, shape[-1]), weight_offset=self.offset
        )
        return y.view(shape), s.view(shape)
