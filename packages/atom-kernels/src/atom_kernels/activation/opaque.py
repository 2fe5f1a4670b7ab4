"""silu_and_mul as an opaque custom op while a graph compiler traces it (atom_kernels/custom_op.py says why)."""

from __future__ import annotations

import torch

from atom_kernels import activation
from atom_kernels.custom_op import opaque, pick

Tensor = torch.Tensor


def _silu_and_mul_impl(x: Tensor) -> Tensor:
    return activation.silu_and_mul(x)


_silu_and_mul_op = opaque(
    "silu_and_mul", _silu_and_mul_impl, lambda x: x.new_empty((x.shape[0], x.shape[1] // 2))
)


def silu_and_mul(x: Tensor) -> Tensor:
    """atom_kernels.silu_and_mul: x [T, 2I] -> [T, I]."""
    return pick(_silu_and_mul_op, _silu_and_mul_impl)(x)
