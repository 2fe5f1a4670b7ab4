"""linear as an opaque custom op while a graph compiler traces it (atom_kernels/custom_op.py says why)."""

from __future__ import annotations

import torch

from atom_kernels.custom_op import opaque, pick
from atom_kernels.linear import linear as _linear

Tensor = torch.Tensor


def _linear_impl(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    gated_input: bool,
    out_dtype: torch.dtype | None,
    sigmoid_gate: Tensor | None = None,
) -> Tensor:
    return _linear(x, weight, bias, gated_input=gated_input, out_dtype=out_dtype, sigmoid_gate=sigmoid_gate)


def _linear_fake(x, weight, bias, gated_input, out_dtype, sigmoid_gate=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=out_dtype or x.dtype)


_linear_op = opaque("linear", _linear_impl, _linear_fake)


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    gated_input: bool = False,
    out_dtype: torch.dtype | None = None,
    sigmoid_gate: Tensor | None = None,
) -> Tensor:
    """atom_kernels.linear.linear: x [..., K] (or [..., 2K] with gated_input), weight [N, K] -> [..., N]
    in out_dtype (None: x's dtype, or torch.float32); sigmoid_gate [..., H, D]: x * sigmoid(gate) in."""
    return pick(_linear_op, _linear_impl)(x, weight, bias, gated_input, out_dtype, sigmoid_gate)
