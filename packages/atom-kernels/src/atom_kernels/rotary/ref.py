"""Pure-torch reference for rotary embeddings, rounding where HF's models round.

Angles and their cos/sin are fp32; cos/sin are then cast to the activations' dtype and
q * cos + rotate_half(q) * sin is evaluated in that dtype (each product and the sum rounded), as
transformers does. In fp32 that is exact fp32 math.
"""

from __future__ import annotations

import torch


def apply_rotary_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    rotary_dim: int,
    scaling: float = 1.0,
    neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q [T, Hq, D] and k [T, Hkv, D]; angle of pair i at position p: p * inv_freq[i].

    neox: pairs are (i, i + rotary_dim/2) (rotate-half); else GPT-J's adjacent (2i, 2i + 1). Dims past
    rotary_dim pass through. cos and sin are multiplied by `scaling` (YaRN's attention factor).
    """
    angles = positions.float()[:, None] * inv_freq.float()[None, :]  # [T, rotary_dim / 2]
    return _rotate_ref(angles, q, k, rotary_dim=rotary_dim, scaling=scaling, neox=neox)


def mrope_axes(half: int, section: tuple[int, int, int], interleaved: bool) -> torch.Tensor:
    """[half] int64: which position row (0 = T, 1 = H, 2 = W) drives each rotary frequency.

    Chunked (Qwen2-VL, Qwen2.5-VL): the first section[0] frequencies follow T, the next section[1]
    H, the last section[2] W. Interleaved (Qwen3-VL, Qwen3.5): frequency i follows H when i % 3 == 1 and
    i < 3 * section[1], W when i % 3 == 2 and i < 3 * section[2], else T.
    """
    if sum(section) != half:
        raise ValueError(f"mrope_section {list(section)} must sum to rotary_dim / 2 = {half}")
    i = torch.arange(half)
    if interleaved:
        axes = torch.zeros(half, dtype=torch.int64)
        axes[(i % 3 == 1) & (i < 3 * section[1])] = 1
        axes[(i % 3 == 2) & (i < 3 * section[2])] = 2
        return axes
    return (i >= section[0]).long() + (i >= section[0] + section[1]).long()


def apply_mrope_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    rotary_dim: int,
    section: tuple[int, int, int],
    interleaved: bool,
    scaling: float = 1.0,
    neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_rotary_ref with 3-D positions [3, T] (T/H/W): frequency i turns by positions[axis(i)]."""
    axes = mrope_axes(rotary_dim // 2, section, interleaved).to(positions.device)
    per_freq = positions.float()[axes].t()  # [T, rotary_dim / 2]
    angles = per_freq * inv_freq.float()[None, :]
    return _rotate_ref(angles, q, k, rotary_dim=rotary_dim, scaling=scaling, neox=neox)


def _rotate_ref(angles, q, k, *, rotary_dim, scaling, neox):
    out = []
    for x in (q, k):
        cos = (angles.cos() * scaling).to(x.dtype)[:, None, :]
        sin = (angles.sin() * scaling).to(x.dtype)[:, None, :]
        rot = x[..., :rotary_dim]
        if neox:
            x1, x2 = rot.chunk(2, dim=-1)
            rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rotated = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        out.append(torch.cat([rotated, x[..., rotary_dim:]], dim=-1))
    return out[0], out[1]
