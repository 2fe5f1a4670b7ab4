"""fp8_linear as an opaque custom op while a graph compiler traces it (atom_kernels/custom_op.py says why)."""

from __future__ import annotations

import torch

from atom_kernels.custom_op import opaque, pick
from atom_kernels.fp8.linear import fp8_linear as _fp8_linear

Tensor = torch.Tensor


def _fp8_linear_impl(
    x: Tensor,
    weight: Tensor,
    scale: Tensor,
    block: list[int],
    bias: Tensor | None,
    pow2_scales: bool,
    gated_input: bool,
) -> Tensor:
    blk = (block[0], block[1])
    return _fp8_linear(x, weight, scale, blk, bias, pow2_scales=pow2_scales, gated_input=gated_input)


_fp8_linear_op = opaque(
    "fp8_linear", _fp8_linear_impl, lambda x, weight, *args: x.new_empty((*x.shape[:-1], weight.shape[0]))
)


def fp8_linear(
    x: Tensor,
    weight: Tensor,
    scale: Tensor,
    block: tuple[int, int],
    bias: Tensor | None = None,
    *,
    pow2_scales: bool = False,
    gated_input: bool = False,
) -> Tensor:
    """atom_kernels.fp8.fp8_linear: x [..., K] (or [..., 2K], gate | up, with gated_input), e4m3 weight
    [N, K] with block scales -> [..., N]."""
    op = pick(_fp8_linear_op, _fp8_linear_impl)
    return op(x, weight, scale, list(block), bias, pow2_scales, gated_input)
