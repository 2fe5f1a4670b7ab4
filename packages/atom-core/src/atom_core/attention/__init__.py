"""Attention backends: the protocol frontends see, and the native paged backend."""

from atom_core.attention.backend import AttentionBackend, AttentionLayer, AttentionLayerSpec
from atom_core.attention.metadata import PagedAttentionMetadata
from atom_core.attention.paged import PagedAttentionBackend, paged_attention

__all__ = [
    "AttentionBackend",
    "AttentionLayer",
    "AttentionLayerSpec",
    "PagedAttentionBackend",
    "PagedAttentionMetadata",
    "paged_attention",
]
