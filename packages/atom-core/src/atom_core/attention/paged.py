"""The native attention backend: paged KV cache, atom-kernels' write, prefill and decode."""

from __future__ import annotations

import torch

from atom_core.attention.backend import LAYER_KINDS, AttentionLayerSpec, QKPrologue
from atom_core.attention.gdn import GDNLayerSpec, GDNSlotLayer
from atom_core.attention.metadata import PagedAttentionMetadata
from atom_core.attention.mla import UNABSORBED_MIN_TOKENS, MLALayerSpec, MLAPagedLayer
from atom_core.cache.allocate import LayerKVCache
from atom_core.cache.specs import PAGED
from atom_core.forward_context import current_forward_context
from atom_kernels.attention import paged_decode, paged_prefill
from atom_kernels.cache import write_kv
from atom_kernels.rotary import qk_norm_rope_write


class PagedAttentionBackend:
    """kernel_backend: "triton", "torch" (the reference, for the CPU) or None (atom_kernels decides)."""

    name = "atom-paged"
    layer_kinds = LAYER_KINDS

    def __init__(
        self,
        layout: str = "flash",
        kernel_backend: str | None = None,
        mla_unabsorbed_min_tokens: int | None = UNABSORBED_MIN_TOKENS,
    ):
        self.layout = layout
        self.kernel_backend = kernel_backend
        self.mla_unabsorbed_min_tokens = mla_unabsorbed_min_tokens  # None: MLA always absorbed

    def make_layer(self, spec: AttentionLayerSpec) -> PagedAttentionLayer:
        return PagedAttentionLayer(spec, self.layout, self.kernel_backend)

    def make_mla_layer(self, spec: MLALayerSpec) -> MLAPagedLayer:
        return MLAPagedLayer(spec, self.kernel_backend, self.mla_unabsorbed_min_tokens)

    def make_gdn_layer(self, spec: GDNLayerSpec) -> GDNSlotLayer:
        """Gated DeltaNet's conv and recurrent states in the engine's per-sequence state slots."""
        return GDNSlotLayer(spec)


class PagedAttentionLayer:
    accepts_strided_inputs = True  # write_kv and the attention kernels take row strides

    def attend_with_prologue(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prologue: QKPrologue, positions: torch.Tensor
    ) -> torch.Tensor | None:
        """q/k norms, rotary and the KV write in one kernel (atom_kernels' qk_norm_rope_write), then
        attention over the cache; None where that kernel does not write the cache (fp8, shuffle) or
        cannot tile the head (not a power of two)."""
        ctx = current_forward_context()
        cache: LayerKVCache = ctx.caches[self.spec.layer_index]
        if self.layout != "flash" or cache.k_scale is not None:
            return None
        if self.spec.head_dim & (self.spec.head_dim - 1):
            return None
        if positions.dim() == 2 and prologue.mrope_section is None:  # the unfused rotary says why not
            return None
        meta = ctx.metadata_for(PAGED)
        p = prologue
        q = qk_norm_rope_write(
            q,
            k,
            v,
            p.q_weight,
            p.k_weight,
            positions,
            p.inv_freq,
            cache.k,
            cache.v,
            meta.slot_mapping,
            eps=p.eps,
            rotary_dim=p.rotary_dim,
            weight_offset=p.weight_offset,
            scaling=p.scaling,
            mrope_section=p.mrope_section if positions.dim() == 2 else None,
            mrope_interleaved=p.mrope_interleaved,
            backend=self.kernel_backend,
        )
        return paged_attention(
            q,
            None,
            None,
            cache.k,
            cache.v,
            meta,
            layout=self.layout,
            softmax_scale=self.spec.scale,
            sliding_window=self.spec.sliding_window,
            sinks=self.spec.sinks,
            kernel_backend=self.kernel_backend,
        )

    def __init__(self, spec: AttentionLayerSpec, layout: str, kernel_backend: str | None):
        self.spec = spec
        self.layout = layout
        self.kernel_backend = kernel_backend

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = current_forward_context()
        cache: LayerKVCache = ctx.caches[self.spec.layer_index]
        return paged_attention(
            q,
            k,
            v,
            cache.k,
            cache.v,
            ctx.metadata_for(PAGED),
            layout=self.layout,
            softmax_scale=self.spec.scale,
            sliding_window=self.spec.sliding_window,
            sinks=self.spec.sinks,
            k_scale=cache.k_scale,
            v_scale=cache.v_scale,
            kernel_backend=self.kernel_backend,
        )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    *,
    layout: str = "flash",
    softmax_scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kernel_backend: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One attention layer's forward over a paged cache: write this forward's K/V, then the decode kernel
    when every sequence adds the same few tokens (meta.decode_query_len), else the prefill kernel.

    q: [T, Hq, D]; k, v: [T, Hkv, D], or None when the caller has written them already; caches in `layout`
    (flash caches may be strided views, as vLLM's packed K|V pages are); meta describes the T tokens.
    sinks: [Hq] fp32; softcap: tanh capping of the scores. Returns [T, Hq, D] (into `out` if given).
    """
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    if k is not None:
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping, layout=layout, backend=kernel_backend, **scales)
    common = dict(
        seq_lens=meta.seq_lens,
        block_tables=meta.block_tables,
        layout=layout,
        softmax_scale=softmax_scale,
        sliding_window=sliding_window,
        softcap=softcap,
        sinks=sinks,
        backend=kernel_backend,
        out=out,
        **scales,
    )
    if (query_len := meta.decode_query_len) is not None:
        return paged_decode(
            q,
            k_cache,
            v_cache,
            query_len=query_len,
            max_seq_len=meta.max_seq_len,
            cu_seqlens_q=meta.cu_seqlens_q,
            **common,
        )
    return paged_prefill(
        q, k_cache, v_cache, cu_seqlens_q=meta.cu_seqlens_q, max_query_len=meta.max_query_len, **common
    )
