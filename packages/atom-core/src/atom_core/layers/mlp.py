"""The gated MLP: down(silu(gate(x)) * up(x)), gate and up in one column-parallel matmul; the activation
is fused into the down projection (layers/fused.py)."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.config import ParallelConfig
from atom_core.layers.fused import silu_and_mul_linear
from atom_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from atom_core.layers.parallel import RankPartial
from atom_core.quantization import QuantConfig


class GatedMLP(nn.Module):
    def __init__(
        self,
        hidden: int,
        intermediate: int,
        *,
        bias: bool,
        dtype,
        parallel: ParallelConfig,
        prefix: str,
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        common = dict(bias=bias, dtype=dtype, parallel=parallel, quant_config=quant_config)
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate, intermediate], prefix=f"{prefix}.gate_up_proj", **common
        )
        self.down_proj = RowParallelLinear(intermediate, hidden, prefix=f"{prefix}.down_proj", **common)

    def defer_output_reduce(self) -> None:
        """forward returns down_proj's partial sum for the next RMSNorm to reduce (tensor parallel)."""
        self.down_proj.defer_reduce = True

    def forward(self, x: torch.Tensor) -> torch.Tensor | RankPartial:
        return silu_and_mul_linear(self.down_proj, self.gate_up_proj(x))
