"""Paged attention: varlen prefill/extend and split-KV decode over the paged KV cache."""

from atom_kernels.attention.decode import paged_decode
from atom_kernels.attention.prefill import paged_prefill
from atom_kernels.attention.ref import paged_attention_ref

__all__ = ["paged_attention_ref", "paged_decode", "paged_prefill"]
