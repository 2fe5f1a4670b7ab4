"""SiLU-and-mul of gated MLPs, through atom-kernels (Triton on GPUs, the torch reference on the CPU)."""

import torch
from torch import nn

from atom_core.ops import silu_and_mul


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2I] -> [T, I]."""
        return silu_and_mul(x)
