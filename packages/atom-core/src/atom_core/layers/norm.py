"""RMSNorm (with the residual add fused in): one kernel per call, fp32 statistics like the reference models."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.layers.parallel import RankPartial
from atom_core.ops import rms_norm


class RMSNorm(nn.Module):
    """offset: 1.0 for the zero-centred norms (Qwen3-Next, Qwen3.5, Gemma) that scale by (1 + weight)."""

    def __init__(self, hidden: int, eps: float, *, dtype, offset: float = 0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.full((hidden,), 1.0 - offset, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor | RankPartial, residual: torch.Tensor | None = None):
        """x: [..., H], or a RankPartial of it (reduced over the ranks here first). With a residual:
        returns (norm(x + residual), x + residual)."""
        if isinstance(x, RankPartial):
            peer = x.parallel.peer_all_reduce
            if residual is not None and peer is not None and peer.takes_rows(x.partial):
                return peer.rms_norm(x.partial, self.weight, self.eps, residual, weight_offset=self.offset)
            x = x.reduce()
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if residual is None:
            return rms_norm(rows, self.weight, self.eps, weight_offset=self.offset).view(shape)
        y, s = rms_norm(
            rows, self.weight, self.eps, residual.reshape(-1, shape[-1]), weight_offset=self.offset
        )
        return y.view(shape), s.view(shape)
