"""Activations fused with the gating multiply of gated MLPs."""

from atom_kernels.activation.silu_and_mul import silu_and_mul

__all__ = ["silu_and_mul"]
