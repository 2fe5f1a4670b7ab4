"""The gated MLP: down(silu(gate(x)) * up(x)), gate and up in one column-parallel matmul.

The activation runs inside the down projection's input load (atom_kernels.linear's gated_input): at
decode's few rows that saves a kernel per layer; at more rows it is silu_and_mul, then the matmul.
"""

from __future__ import annotations

import torch
from torch import nn

from atom_core.config import ParallelConfig
from atom_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, *, bias: bool, dtype, parallel: ParallelConfig):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate, intermediate], bias=bias, dtype=dtype, parallel=parallel
        )
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias, dtype=dtype, parallel=parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), gated_input=True)
