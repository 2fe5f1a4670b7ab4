"""Attention backends: the protocol frontends see, and the native paged backend."""

from atom_core.attention.backend import LAYER_KINDS, AttentionBackend, AttentionLayer, AttentionLayerSpec
from atom_core.attention.metadata import PagedAttentionMetadata
from atom_core.attention.paged import PagedAttentionBackend, paged_attention

__all__ = [
    "LAYER_KINDS",
    "AttentionBackend",
    "AttentionLayer",
    "AttentionLayerSpec",
    "PagedAttentionBackend",
    "PagedAttentionMetadata",
    "paged_attention",
]
