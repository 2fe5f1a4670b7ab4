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
