"""The RMSNorms as opaque custom ops while a graph compiler traces them (atom_kernels/custom_op.py says why)."""

from __future__ import annotations

import torch

from atom_kernels import norm
from atom_kernels.custom_op import like_x, opaque, pick

Tensor = torch.Tensor


def _rms_norm_impl(x: Tensor, weight: Tensor, eps: float, weight_offset: float) -> Tensor:
    return norm.rms_norm(x, weight, eps, weight_offset=weight_offset)


def _rms_norm_residual_impl(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor, weight_offset: float
) -> tuple[Tensor, Tensor]:
    return norm.rms_norm(x, weight, eps, residual, weight_offset=weight_offset)


_rms_norm_op = opaque("rms_norm", _rms_norm_impl, like_x)
_rms_norm_residual_op = opaque(
    "rms_norm_residual", _rms_norm_residual_impl, lambda x, *args: (like_x(x), like_x(x))
)


def rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None, *, weight_offset: float = 0.0
) -> Tensor | tuple[Tensor, Tensor]:
    """atom_kernels.rms_norm: x [T, H] -> out [T, H], or (out, x + residual) with a residual."""
    if residual is None:
        return pick(_rms_norm_op, _rms_norm_impl)(x, weight, eps, weight_offset)
    return pick(_rms_norm_residual_op, _rms_norm_residual_impl)(x, weight, eps, residual, weight_offset)


def _rms_norm_gated_impl(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    return norm.rms_norm_gated(x, gate, weight, eps)


_rms_norm_gated_op = opaque("rms_norm_gated", _rms_norm_gated_impl, like_x)


def rms_norm_gated(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """atom_kernels.rms_norm_gated: x, gate [N, D] -> [N, D]."""
    return pick(_rms_norm_gated_op, _rms_norm_gated_impl)(x, gate, weight, eps)
