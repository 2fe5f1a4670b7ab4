"""Argument packs of the rotary kernels and their shared checks.

A kernel takes each tensor it rotates (or writes) as one HeadRows pack, and Triton passes the pack's
fields as it would plain arguments, so RoPE, MRoPE and the fused q/k prologue write a launch once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class HeadRows(NamedTuple):
    """Rows x [T, H, D] of one tensor (a strided view with a contiguous last dim)."""

    x: torch.Tensor
    stride_t: int
    stride_h: int
    num_heads: int


def head_rows(x: torch.Tensor) -> HeadRows:
    return HeadRows(x, x.stride(0), x.stride(1), x.shape[1])


def check_rotation(q: torch.Tensor, k: torch.Tensor, rotary_dim: int, inv_freq: torch.Tensor) -> None:
    """q [T, Hq, D] and k [T, Hkv, D] with one T and D and a contiguous last dim, rotating their first
    rotary_dim (even) dims by inv_freq [rotary_dim / 2]; a ValueError naming what is not so."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q and k must be [T, H, D] with one T and D, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if rotary_dim % 2 or not 0 < rotary_dim <= q.shape[2] or inv_freq.shape != (rotary_dim // 2,):
        raise ValueError(
            f"rotary_dim {rotary_dim} must be even, <= {q.shape[2]}, with inv_freq [rotary_dim / 2]"
        )
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k need a contiguous last dimension")
