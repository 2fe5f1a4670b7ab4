"""Pure-torch reference for the linear family (fp32 math, cast back)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, gated_input: bool = False
) -> torch.Tensor:
    """x: [M, K] (or [M, 2K] with gated_input: silu(x[:, :K]) * x[:, K:] is the input); weight: [N, K];
    bias: [N] -> [M, N] in x's dtype."""
    xf = x.float()
    if gated_input:
        gate, up = xf.chunk(2, dim=-1)
        # The fused kernel rounds the activation to x's dtype before the product, as the two-kernel path does.
        xf = (F.silu(gate) * up).to(x.dtype).float()
    y = xf @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
