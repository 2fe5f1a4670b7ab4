"""The surface framework adapters may use (enforced by import-linter; see the root pyproject).

Build a model for an architecture with the adapter's own attention backend and parallel setup, load its
weights from (name, tensor) pairs, run it inside a bound ForwardContext, compute logits; plus each
layer kind's step (paged_attention, mla_step, gdn_step), which an adapter's layer calls with a view of
its engine's metadata. Adapters reach atom_kernels only through here, so an adapter release depends on
one atom-core range.

Importing this module is cheap (no torch): engine plugins import it from their entry-point modules,
which engines load in every process. Everything else loads on first use.
"""

from atom_core import __version__ as __version__
from atom_core.integration.plugin import EnginePlugin as EnginePlugin
from atom_core.integration.version import EngineVersionError as EngineVersionError
from atom_core.integration.version import check_engine_version as check_engine_version

# Every other public name, listed once, by the module that defines it (imported on first use).
_LAZY_MODULES = {
    "atom_core.attention": (
        "LAYER_KINDS",
        "AttentionBackend",
        "AttentionLayer",
        "AttentionLayerSpec",
        "PagedAttentionBackend",
        "PagedAttentionMetadata",
        "paged_attention",
    ),
    "atom_core.attention.gdn": ("GDNLayerSpec",),
    "atom_core.attention.gdn_step": (
        "GDNBlockVerify",
        "GDNScratchVerify",
        "GDNStates",
        "GDNStepView",
        "gdn_step",
    ),
    "atom_core.attention.mla": ("MLALayerSpec", "mla_step"),
    "atom_core.build": ("BuildContext",),
    "atom_core.cache": (
        "CacheSpec",
        "LatentCacheSpec",
        "LayerKVCache",
        "PagedKVSpec",
        "StateCacheSpec",
        "allocate_caches",
        "collect_cache_specs",
    ),
    "atom_core.config": ("CacheConfig", "ModelConfig", "ParallelConfig"),
    "atom_core.forward_context": ("ForwardContext", "bind_forward_context", "current_forward_context"),
    "atom_core.integration.build": ("build_for_engine",),
    "atom_core.integration.weights": ("ATOM_PREFIX", "atom_module_prefix", "load_atom_weights"),
    "atom_core.layers.embedding": ("SharedVocab",),
    "atom_core.loader": ("build_model", "finish_loading", "iter_checkpoint", "load_checkpoint"),
    # stateless kernels only: a stateful layer kind's step is composed in core (gdn_step, mla_step,
    # paged_attention), never by an adapter
    "atom_core.ops": ("paged_decode", "paged_prefill", "silu_and_mul", "write_kv"),
    "atom_core.registry": ("ModelSpec", "get_model_spec", "supported_architectures"),
}
_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names}

__all__ = sorted(
    ["EnginePlugin", "EngineVersionError", "__version__", "check_engine_version", *_LAZY],
    key=str.casefold,
)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
