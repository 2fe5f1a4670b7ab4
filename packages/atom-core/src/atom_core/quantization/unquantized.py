"""Unquantized weights: one [out, in] parameter in the model's dtype, atom-kernels' linear."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.ops import linear


class UnquantizedLinearMethod:
    name = "unquantized"

    def create_weights(self, layer: nn.Module, in_local: int, out_local: int, dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(torch.empty(out_local, in_local, dtype=dtype), requires_grad=False)
        layer.weight.weight_loader = layer.weight_loader

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, layer.weight, bias)

    def apply_silu_and_mul(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2 * in_local] (gate | up) -> layer(silu(gate) * up), the activation in the matmul's load."""
        return linear(x, layer.weight, gated_input=True)

    def apply_sigmoid_gate(self, layer: nn.Module, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x: [T, in_local], gate [T, H, D] (H * D = in_local) -> x * sigmoid(gate) @ weight^T, the gate
        applied in the matmul's load at one row (a row-parallel layer's bias comes after the reduction)."""
        return linear(x, layer.weight, sigmoid_gate=gate)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        return None

    def dense(self, layer: nn.Module) -> torch.Tensor:
        """The [out_local, in_local] matrix itself."""
        return layer.weight


class Unquantized:
    name = "unquantized"
    method = UnquantizedLinearMethod()

    def linear_method(self, prefix: str, packed_from: tuple[str, ...] = ()) -> UnquantizedLinearMethod:
        return self.method

    def experts_block(self, prefix: str) -> None:
        return None

    def experts_mxfp4(self, prefix: str) -> bool:
        return False


UNQUANTIZED = Unquantized()
