"""Caches as layers declare them: per-layer specs (what memory a layer needs), allocation and sizing."""

from atom_core.cache.allocate import (
    LatentCache,
    LayerCache,
    LayerKVCache,
    StateCache,
    allocate_caches,
    bytes_per_block,
    bytes_per_slot,
    copy_state_rows,
)
from atom_core.cache.metadata import StateMetadata
from atom_core.cache.specs import (
    CacheSpec,
    LatentCacheSpec,
    PagedKVSpec,
    StateCacheSpec,
    collect_cache_specs,
    metadata_kinds,
)

__all__ = [
    "CacheSpec",
    "LatentCache",
    "LatentCacheSpec",
    "LayerCache",
    "LayerKVCache",
    "PagedKVSpec",
    "StateCache",
    "StateCacheSpec",
    "StateMetadata",
    "allocate_caches",
    "bytes_per_block",
    "bytes_per_slot",
    "collect_cache_specs",
    "copy_state_rows",
    "metadata_kinds",
]
