"""The gated MLP: down(act(gate(x)) * up(x)), gate and up in one column-parallel matmul; SiLU is fused into
the down projection (layers/fused.py), GELU-tanh (Gemma) runs in torch before it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
        activation: str = "silu",
    ):
        """activation: "silu", or "gelu_tanh" (GELU with the tanh approximation: Gemma's gelu_pytorch_tanh)."""
        super().__init__()
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"GatedMLP activation {activation!r} is not one of 'silu', 'gelu_tanh'")
        self.activation = activation
        common = dict(bias=bias, dtype=dtype, parallel=parallel, quant_config=quant_config)
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate, intermediate], prefix=f"{prefix}.gate_up_proj", **common
        )
        self.down_proj = RowParallelLinear(intermediate, hidden, prefix=f"{prefix}.down_proj", **common)

    def defer_output_reduce(self) -> None:
        """forward returns down_proj's partial sum for the next RMSNorm to reduce (tensor parallel)."""
        self.down_proj.defer_reduce = True

    def forward(self, x: torch.Tensor) -> torch.Tensor | RankPartial:
        if self.activation == "gelu_tanh":
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.gelu(gate, approximate="tanh") * up)
        return silu_and_mul_linear(self.down_proj, self.gate_up_proj(x))
