"""Pure-torch reference for RMSNorm, rounding where the HF models round (in the input dtype)."""

from __future__ import annotations

import torch


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    weight_offset: float = 0.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x: [T, H], weight: [H]. y = (weight + weight_offset) * (s / rms(s)) with s = x (+ residual).

    The sum s is rounded to x's dtype; the norm is computed in fp32 and rounded before the weight multiply.
    With a residual returns (y, s), else y.
    """
    s = x if residual is None else x + residual
    sf = s.float()
    normed = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    w = weight if weight_offset == 0.0 else (weight.float() + weight_offset).to(weight.dtype)
    y = w * normed
    return y if residual is None else (y, s)


def rms_norm_gated_ref(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN's output norm (Qwen3-Next, Qwen3.5): y = (weight * rmsnorm(x)) * silu(gate), per row of x [N, D].

    Rounded as transformers rounds: the norm to x's dtype, the weight product in the weight's dtype
    promotion, the gate product in fp32, the result to x's dtype.
    """
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return ((weight * normed) * torch.nn.functional.silu(gate.float())).to(x.dtype)
