"""Attention backends: the protocol frontends see, and the native paged backend."""

from atom_core.attention.backend import AttentionBackend, AttentionLayer, AttentionLayerSpec
from atom_core.attention.kv_cache import LayerKVCache, allocate_kv_caches
from atom_core.attention.metadata import PagedAttentionMetadata
from atom_core.attention.paged import PagedAttentionBackend, paged_attention

__all__ = [
    "AttentionBackend",
    "AttentionLayer",
    "AttentionLayerSpec",
    "LayerKVCache",
    "PagedAttentionBackend",
    "PagedAttentionMetadata",
    "allocate_kv_caches",
    "paged_attention",
]
