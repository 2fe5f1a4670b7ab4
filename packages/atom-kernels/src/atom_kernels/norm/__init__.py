"""Normalization: RMSNorm with the residual add fused in (and Gemma's 1 + weight variant)."""

from atom_kernels.norm.rms_norm import rms_norm

__all__ = ["rms_norm"]
