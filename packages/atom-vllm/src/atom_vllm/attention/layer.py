"""The atom-core AttentionBackend ATOM models are built with inside vLLM: each attention layer is a vLLM
Attention module (so vLLM allocates, binds and schedules its KV cache) running the "ATOM" backend."""

from __future__ import annotations

import copy

import torch
from vllm.model_executor.layers.attention import Attention

from atom_core.integration import LAYER_KINDS, AttentionLayerSpec, GDNLayerSpec, MLALayerSpec
from atom_vllm.attention.backend import AtomAttentionBackend
from atom_vllm.attention.gdn import VllmGDNLayer
from atom_vllm.attention.mla import VllmMLALayer


class VllmAttentionLayer(Attention):
    """atom-core's AttentionLayer contract on a vLLM Attention: (q [T, Hq, D], k, v [T, Hkv, D]) -> [T, Hq, D]."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return super().forward(q, k, v).view(q.shape[0], self.num_heads, self.head_size)


class CoreAttentionBackend:
    """atom-core's AttentionBackend protocol under vLLM (given to build_for_engine): one VllmAttentionLayer
    per AttentionLayerSpec, one VllmMLALayer per MLALayerSpec and one VllmGDNLayer per GDNLayerSpec, whose
    caches vLLM sizes from the layers' cache specs."""

    name = "vllm"
    layer_kinds = LAYER_KINDS

    def __init__(self, cache_config, backend_cls: type = AtomAttentionBackend):
        self.cache_config = cache_config
        self.backend_cls = backend_cls

    def make_layer(self, spec: AttentionLayerSpec) -> VllmAttentionLayer:
        # spec.prefix is the layer's module path in the wrapper, which vLLM uses as the layer's name. vLLM's
        # Attention declares its KV spec (full or sliding window) from the heads, dims and window given here:
        # the layer's own cache spec.
        cache = spec.cache_spec()
        # sinks (GPT-OSS) go to the backend's impl as vLLM's own models pass them
        extra = {} if spec.sinks is None else {"sinks": spec.sinks}
        return VllmAttentionLayer(
            spec.num_heads,
            cache.head_dim,
            spec.scale,
            num_kv_heads=cache.num_kv_heads,
            cache_config=self._cache_config(cache.sliding_window),
            per_layer_sliding_window=cache.sliding_window,
            prefix=spec.prefix,
            attn_backend=self.backend_cls,
            **extra,
        )

    def make_mla_layer(self, spec: MLALayerSpec) -> VllmMLALayer:
        """DeepSeek's latent attention: the adapter's own layer over vLLM's latent cache ("ATOM_MLA")."""
        return VllmMLALayer(spec)

    def make_gdn_layer(self, spec: GDNLayerSpec) -> VllmGDNLayer:
        """Gated DeltaNet: the adapter's own mamba-type layer over vLLM's state cache ("ATOM_GDN")."""
        return VllmGDNLayer(spec)

    def _cache_config(self, window: int | None):
        """vLLM gives a layer without a window of its own the model-wide `cache_config.sliding_window`
        (set from the config's `sliding_window` unless `layer_types` mixes kinds). atom-core has already
        decided each layer's window as transformers does, so a full layer gets a config without one."""
        if window is not None or self.cache_config is None or self.cache_config.sliding_window is None:
            return self.cache_config
        config = copy.copy(self.cache_config)
        config.sliding_window = None
        return config
