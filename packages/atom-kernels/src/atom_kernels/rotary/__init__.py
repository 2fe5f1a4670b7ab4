"""Rotary position embeddings (RoPE and multimodal MRoPE) applied in place to q and k in one launch."""

from atom_kernels.rotary.mrope import apply_mrope
from atom_kernels.rotary.rope import apply_rotary

__all__ = ["apply_mrope", "apply_rotary"]
