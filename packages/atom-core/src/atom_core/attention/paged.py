"""The native attention backend: paged KV cache, atom-kernels' write, prefill and decode."""

from __future__ import annotations

import torch

from atom_core.attention.backend import AttentionLayerSpec
from atom_core.attention.kv_cache import LayerKVCache
from atom_core.attention.metadata import PagedAttentionMetadata
from atom_core.forward_context import current_forward_context
from atom_kernels.attention import paged_decode, paged_prefill
from atom_kernels.cache import write_kv


class PagedAttentionBackend:
    """kernel_backend: "triton", "torch" (the reference, for the CPU) or None (atom_kernels decides)."""

    name = "atom-paged"

    def __init__(self, layout: str = "flash", kernel_backend: str | None = None):
        self.layout = layout
        self.kernel_backend = kernel_backend

    def make_layer(self, spec: AttentionLayerSpec) -> PagedAttentionLayer:
        return PagedAttentionLayer(spec, self.layout, self.kernel_backend)


class PagedAttentionLayer:
    def __init__(self, spec: AttentionLayerSpec, layout: str, kernel_backend: str | None):
        self.spec = spec
        self.layout = layout
        self.kernel_backend = kernel_backend

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = current_forward_context()
        meta: PagedAttentionMetadata = ctx.attn_metadata
        cache: LayerKVCache = ctx.kv_caches[self.spec.layer_index]
        scales = dict(k_scale=cache.k_scale, v_scale=cache.v_scale)
        write_kv(
            k,
            v,
            cache.k,
            cache.v,
            meta.slot_mapping,
            layout=self.layout,
            backend=self.kernel_backend,
            **scales,
        )
        common = dict(
            seq_lens=meta.seq_lens, block_tables=meta.block_tables, layout=self.layout,
            softmax_scale=self.spec.scale, sliding_window=self.spec.sliding_window, backend=self.kernel_backend,
        )  # fmt: skip
        if meta.is_decode:
            return paged_decode(q, cache.k, cache.v, max_seq_len=meta.max_seq_len, **common, **scales)
        return paged_prefill(q, cache.k, cache.v, cu_seqlens_q=meta.cu_seqlens_q, max_query_len=meta.max_query_len,
                             **common, **scales)  # fmt: skip
