"""What each attention-like layer needs cached, declared by the layer itself.

A layer that keeps per-token or per-sequence state has `cache_index` (its slot in the ForwardContext's
caches) and `cache_spec` (one of the specs below). The engine walks the model for them and allocates
exactly that; an adapter declares its engine's cache from the same specs. Two things follow from a spec:
the memory (`PagedKVSpec`, `LatentCacheSpec`: pages shared through the block manager; `StateCacheSpec`:
one slot per running sequence) and the per-forward metadata it is addressed by (`metadata_kind`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

PAGED, STATE = "paged", "state"  # metadata kinds: block tables + slot mapping, or one state slot per sequence


@dataclass(frozen=True, slots=True)
class PagedKVSpec:
    """K and V rows of num_kv_heads x head_dim per token, in pages (layer kinds mha and sliding).

    num_kv_heads: on this rank. sliding_window: the layer sees that many most recent positions (None: all).
    """

    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None

    metadata_kind: ClassVar[str] = PAGED

    @property
    def layer_kind(self) -> str:
        return "mha" if self.sliding_window is None else "sliding"


@dataclass(frozen=True, slots=True)
class LatentCacheSpec:
    """One row of `width` values per token, in pages (MLA: kv_lora_rank + rope dims, no separate V)."""

    width: int

    metadata_kind: ClassVar[str] = PAGED
    layer_kind: ClassVar[str] = "mla"


@dataclass(frozen=True, slots=True)
class StateCacheSpec:
    """Fixed-size state per sequence, whatever its length (GDN: conv and recurrent state).

    states: (name, shape of one sequence's state, dtype) for each tensor; dtype None means the model's.
    """

    states: tuple[tuple[str, tuple[int, ...], torch.dtype | None], ...]

    metadata_kind: ClassVar[str] = STATE
    layer_kind: ClassVar[str] = "gdn"


CacheSpec = PagedKVSpec | LatentCacheSpec | StateCacheSpec


def collect_cache_specs(model: nn.Module) -> list[CacheSpec]:
    """The cache spec of every layer that declares one, in cache-index order (0..n-1, each exactly once)."""
    found: dict[int, tuple[str, CacheSpec]] = {}
    for name, module in model.named_modules():
        spec = getattr(module, "cache_spec", None)
        if spec is None:
            continue
        index = module.cache_index
        if index in found:
            raise ValueError(f"{name} and {found[index][0]} both declare cache index {index}")
        found[index] = (name, spec)
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"cache indices must be 0..{len(found) - 1}, the model declares {sorted(found)}")
    return [found[i][1] for i in range(len(found))]


def metadata_kinds(specs: Sequence[CacheSpec]) -> frozenset[str]:
    """The per-forward metadata a model with these caches needs."""
    return frozenset(spec.metadata_kind for spec in specs)
