"""Pure-torch references for the activation family (fp32 math, cast back)."""

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2*I] -> [T, I]: silu(x[:, :I]) * x[:, I:]."""
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)
