"""RoPE and MRoPE as opaque custom ops while a graph compiler traces them (atom_kernels/custom_op.py says
why). Both rotate q and k in place: the ops declare them mutated."""

from __future__ import annotations

import torch

from atom_kernels import rotary
from atom_kernels.custom_op import opaque, pick

Tensor = torch.Tensor


def _apply_rotary_impl(
    positions: Tensor, q: Tensor, k: Tensor, inv_freq: Tensor, rotary_dim: int, scaling: float, neox: bool
) -> None:
    rotary.apply_rotary(positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=scaling, neox=neox)


_apply_rotary_op = opaque("apply_rotary", _apply_rotary_impl, lambda *args: None, mutates=("q", "k"))


def apply_rotary(
    positions: Tensor,
    q: Tensor,
    k: Tensor,
    inv_freq: Tensor,
    *,
    rotary_dim: int,
    scaling: float = 1.0,
    neox: bool = True,
) -> tuple[Tensor, Tensor]:
    """atom_kernels.apply_rotary: rotates q [T, Hq, D] and k [T, Hkv, D] in place; returns (q, k)."""
    pick(_apply_rotary_op, _apply_rotary_impl)(positions, q, k, inv_freq, rotary_dim, scaling, neox)
    return q, k


def _apply_mrope_impl(
    positions: Tensor,
    q: Tensor,
    k: Tensor,
    inv_freq: Tensor,
    rotary_dim: int,
    section: list[int],
    interleaved: bool,
    scaling: float,
    neox: bool,
) -> None:
    rotary.apply_mrope(
        positions, q, k, inv_freq, rotary_dim=rotary_dim, section=section, interleaved=interleaved,
        scaling=scaling, neox=neox,
    )  # fmt: skip


_apply_mrope_op = opaque("apply_mrope", _apply_mrope_impl, lambda *args: None, mutates=("q", "k"))


def apply_mrope(
    positions: Tensor,
    q: Tensor,
    k: Tensor,
    inv_freq: Tensor,
    *,
    rotary_dim: int,
    section: tuple[int, int, int] | list[int],
    interleaved: bool,
    scaling: float = 1.0,
    neox: bool = True,
) -> tuple[Tensor, Tensor]:
    """atom_kernels.apply_mrope: rotates q and k in place by positions [3, T]; returns (q, k)."""
    args = (positions, q, k, inv_freq, rotary_dim, list(section), interleaved, scaling, neox)
    pick(_apply_mrope_op, _apply_mrope_impl)(*args)
    return q, k
