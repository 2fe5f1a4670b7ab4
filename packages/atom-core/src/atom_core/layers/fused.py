"""Fused ops across layers, explicit at the call site (a layer's forward stays what its name says)."""

from __future__ import annotations

import torch

from atom_core.layers.linear import RowParallelLinear
from atom_core.layers.parallel import RankPartial
from atom_core.ops import silu_and_mul


def silu_and_mul_linear(layer: RowParallelLinear, gate_up: torch.Tensor) -> torch.Tensor | RankPartial:
    """layer(silu(gate) * up) for gate_up [T, 2 * K_local] -> [T, N].

    Where the layer's weight method has the fused kernel (atom-kernels' linear applies the activation in
    its input load: at decode's few rows that saves a kernel per layer), it runs; otherwise the activation,
    then the layer."""
    method = layer.quant_method
    fused = getattr(method, "apply_silu_and_mul", None)
    if fused is None:
        return layer(silu_and_mul(gate_up))
    return layer.reduce(fused(layer, gate_up))


def sigmoid_gate_linear(
    layer: RowParallelLinear, x: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor | RankPartial:
    """layer(x * sigmoid(gate)) for x [T, H * D] and gate [T, H, D] (heads at any stride: the gate stays
    where the projection put it) -> [T, N].

    Where the layer's weight method has the fused kernel (unquantized weights: the one-row GEMV scales x
    in its load), the product and the gate's copy need no kernels of their own; otherwise torch's ops,
    then the layer."""
    fused = getattr(layer.quant_method, "apply_sigmoid_gate", None)
    if fused is None:
        return layer(x * torch.sigmoid(gate.reshape(x.shape)))
    return layer.reduce(fused(layer, x, gate))
