"""The surface framework adapters may use (enforced by import-linter; see the root pyproject).

Build a model for an architecture with the adapter's own attention backend and parallel setup, load its
weights from (name, tensor) pairs, run it inside a bound ForwardContext, compute logits; plus the
kernel entry points an adapter's attention backend calls. Adapters reach atom_kernels only through here,
so an adapter release depends on one atom-core range.

Importing this module is cheap (no torch): engine plugins import it from their entry-point modules,
which engines load in every process. Everything else loads on first use.
"""

from typing import TYPE_CHECKING

from atom_core import __version__
from atom_core.integration.plugin import EnginePlugin
from atom_core.integration.version import EngineVersionError, check_engine_version

if TYPE_CHECKING:
    from atom_core.attention import (
        AttentionBackend,
        AttentionLayer,
        AttentionLayerSpec,
        PagedAttentionBackend,
        PagedAttentionMetadata,
        paged_attention,
    )
    from atom_core.attention.gdn import GDNLayerSpec
    from atom_core.attention.mla import MLALayerSpec
    from atom_core.build import BuildContext
    from atom_core.cache import (
        CacheSpec,
        LatentCacheSpec,
        LayerKVCache,
        PagedKVSpec,
        StateCacheSpec,
        allocate_caches,
        collect_cache_specs,
    )
    from atom_core.config import CacheConfig, ModelConfig, ParallelConfig
    from atom_core.forward_context import ForwardContext, bind_forward_context, current_forward_context
    from atom_core.integration.build import build_for_engine
    from atom_core.layers.embedding import SharedVocab
    from atom_core.loader import build_model, finish_loading, iter_checkpoint, load_checkpoint
    from atom_core.ops import (
        causal_conv1d,
        gated_delta_rule_chunked,
        gated_delta_rule_recurrent,
        gdn_gating,
        mla_attention,
        paged_decode,
        paged_prefill,
        silu_and_mul,
        write_kv,
        write_latent,
    )
    from atom_core.registry import ModelSpec, get_model_spec, supported_architectures

_LAZY = {
    "AttentionBackend": "atom_core.attention",
    "AttentionLayer": "atom_core.attention",
    "AttentionLayerSpec": "atom_core.attention",
    "CacheSpec": "atom_core.cache",
    "LatentCacheSpec": "atom_core.cache",
    "LayerKVCache": "atom_core.cache",
    "PagedKVSpec": "atom_core.cache",
    "StateCacheSpec": "atom_core.cache",
    "allocate_caches": "atom_core.cache",
    "collect_cache_specs": "atom_core.cache",
    "PagedAttentionBackend": "atom_core.attention",
    "PagedAttentionMetadata": "atom_core.attention",
    "paged_attention": "atom_core.attention",
    "MLALayerSpec": "atom_core.attention.mla",
    "GDNLayerSpec": "atom_core.attention.gdn",
    "BuildContext": "atom_core.build",
    "CacheConfig": "atom_core.config",
    "ModelConfig": "atom_core.config",
    "ParallelConfig": "atom_core.config",
    "ForwardContext": "atom_core.forward_context",
    "bind_forward_context": "atom_core.forward_context",
    "current_forward_context": "atom_core.forward_context",
    "build_model": "atom_core.loader",
    "build_for_engine": "atom_core.integration.build",
    "SharedVocab": "atom_core.layers.embedding",
    "finish_loading": "atom_core.loader",
    "iter_checkpoint": "atom_core.loader",
    "load_checkpoint": "atom_core.loader",
    "mla_attention": "atom_core.ops",
    "causal_conv1d": "atom_core.ops",
    "gated_delta_rule_chunked": "atom_core.ops",
    "gated_delta_rule_recurrent": "atom_core.ops",
    "gdn_gating": "atom_core.ops",
    "write_latent": "atom_core.ops",
    "paged_decode": "atom_core.ops",
    "paged_prefill": "atom_core.ops",
    "silu_and_mul": "atom_core.ops",
    "write_kv": "atom_core.ops",
    "ModelSpec": "atom_core.registry",
    "get_model_spec": "atom_core.registry",
    "supported_architectures": "atom_core.registry",
}

__all__ = [
    "AttentionBackend",
    "AttentionLayer",
    "AttentionLayerSpec",
    "BuildContext",
    "CacheConfig",
    "CacheSpec",
    "EnginePlugin",
    "EngineVersionError",
    "ForwardContext",
    "GDNLayerSpec",
    "LatentCacheSpec",
    "LayerKVCache",
    "MLALayerSpec",
    "ModelConfig",
    "ModelSpec",
    "PagedAttentionBackend",
    "PagedAttentionMetadata",
    "PagedKVSpec",
    "ParallelConfig",
    "SharedVocab",
    "StateCacheSpec",
    "__version__",
    "allocate_caches",
    "bind_forward_context",
    "build_for_engine",
    "build_model",
    "causal_conv1d",
    "check_engine_version",
    "collect_cache_specs",
    "current_forward_context",
    "finish_loading",
    "gated_delta_rule_chunked",
    "gated_delta_rule_recurrent",
    "gdn_gating",
    "get_model_spec",
    "iter_checkpoint",
    "load_checkpoint",
    "mla_attention",
    "paged_attention",
    "paged_decode",
    "paged_prefill",
    "silu_and_mul",
    "supported_architectures",
    "write_kv",
    "write_latent",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
