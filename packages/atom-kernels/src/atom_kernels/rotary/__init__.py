"""Rotary position embeddings (RoPE and multimodal MRoPE) applied in place to q and k in one launch, and
fused with the q/k norms and the KV-cache write (qk_norm_rope_write)."""

from atom_kernels.rotary.fused_qk import qk_norm_rope_write
from atom_kernels.rotary.mrope import apply_mrope
from atom_kernels.rotary.rope import apply_rotary

__all__ = ["apply_mrope", "apply_rotary", "qk_norm_rope_write"]
