"""Multimodal RoPE (Qwen2-VL/2.5-VL chunked sections, Qwen3-VL/3.5 interleaved) for q and k in place, in one
launch that reads the [3, T] positions itself: no gathered cos/sin tensor is built or read."""

from __future__ import annotations

import torch

from atom_kernels.rotary.packs import check_rotation
from atom_kernels.rotary.ref import apply_mrope_ref
from atom_kernels.rotary.rope import apply_rotary, launch_rotation
from atom_kernels.settings import Backend, resolve_backend


def apply_mrope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    rotary_dim: int,
    section: tuple[int, int, int] | list[int],
    interleaved: bool,
    scaling: float = 1.0,
    neox: bool = True,
    backend: Backend | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by 3-D positions; returns (q, k).

    positions: [3, T] int (rows T, H, W; a [T] tensor is text-only: every row equal, so plain RoPE);
    section: frequencies per axis, summing to rotary_dim / 2 ([16, 24, 24] for Qwen2-VL's chunked
    layout, [11, 11, 10] for Qwen3.5's interleaved one with rotary_dim 64 of head 256). Other arguments
    as `apply_rotary`.
    """
    if positions.dim() == 1:
        return apply_rotary(
            positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=scaling, neox=neox, backend=backend
        )
    section = tuple(int(s) for s in section)
    if len(section) != 3 or sum(section) != rotary_dim // 2 or min(section) < 0:
        raise ValueError(
            f"mrope section {list(section)} must be 3 sizes summing to rotary_dim / 2 = {rotary_dim // 2}"
        )
    check_rotation(q, k, rotary_dim, inv_freq)
    if positions.dim() != 2 or positions.shape != (3, q.shape[0]) or positions.stride(-1) != 1:
        raise ValueError(f"positions must be [3, T={q.shape[0]}] (T/H/W rows), got {tuple(positions.shape)}")
    if resolve_backend(backend, q.device) is Backend.TORCH:
        rq, rk = apply_mrope_ref(
            positions, q, k, inv_freq, rotary_dim=rotary_dim, section=section, interleaved=interleaved,
            scaling=scaling, neox=neox,
        )  # fmt: skip
        return q.copy_(rq), k.copy_(rk)
    if q.shape[0]:
        launch_rotation(
            positions,
            q,
            k,
            inv_freq,
            rotary_dim=rotary_dim,
            scaling=scaling,
            section=section,
            interleaved=interleaved,
            neox=neox,
        )
    return q, k
