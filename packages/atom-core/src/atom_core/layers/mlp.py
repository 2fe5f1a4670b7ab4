"""The gated MLP: down(silu(gate(x)) * up(x)), gate and up in one column-parallel matmul."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.config import ParallelConfig
from atom_core.layers.activation import SiluAndMul
from atom_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, *, bias: bool, dtype, parallel: ParallelConfig):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate], bias=bias, dtype=dtype,
                                                       parallel=parallel)  # fmt: skip
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias, dtype=dtype, parallel=parallel)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))
