"""Normalization: RMSNorm with the residual add fused in (and Gemma's 1 + weight variant), and the gated
RMSNorm of gated-delta-net outputs."""

from atom_kernels.norm.gated import rms_norm_gated
from atom_kernels.norm.rms_norm import rms_norm

__all__ = ["rms_norm", "rms_norm_gated"]
