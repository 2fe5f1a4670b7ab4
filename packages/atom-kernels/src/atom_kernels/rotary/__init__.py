"""Rotary position embeddings applied in place to q and k in one launch."""

from atom_kernels.rotary.rope import apply_rotary

__all__ = ["apply_rotary"]
