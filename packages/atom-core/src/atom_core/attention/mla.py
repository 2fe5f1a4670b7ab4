"""Multi-head latent attention (MLA) through the backend seam, and the native backend's MLA layer.

The frontend (layers/mla.py) absorbs the key and value up-projections: each head's query reaches the
backend as [kv_lora_rank + rope] (the latent and rotary parts), every head reads the same cached latent
row of [kv_lora_rank + rope] per token, and the output stays latent ([kv_lora_rank] per head) until the
frontend maps it back through W_UV.

A batch of fresh prefills whose longest sequence has UNABSORBED_MIN_TOKENS new tokens is cheaper
un-absorbed: the frontend up-projects each token's latent to per-head K and V once and the layer runs
dense causal attention over them (q.k over nope + rope, 192 wide for DeepSeek-V3, instead of 576 per
head and row), still writing the latent rows for the steps after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from atom_core.attention.metadata import PagedAttentionMetadata
from atom_core.cache.allocate import LatentCache
from atom_core.cache.specs import PAGED, LatentCacheSpec
from atom_core.forward_context import current_forward_context
from atom_core.ops import mla_attention, varlen_causal_attention, write_latent

# benchmarks/bench_mla_prefill.py (DeepSeek-V3's layer): un-absorbed from 2048 tokens a sequence on, where it
# wins with 128 heads and with 16; at 1024, 128 heads gain but 16 lose
UNABSORBED_MIN_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class MLALayerSpec:
    layer_index: int  # its cache index
    num_heads: int  # q heads on this rank
    kv_lora_rank: int  # the latent's width
    rope_dim: int  # the rotary part of q and k (qk_rope_head_dim)
    scale: float  # softmax scale of the un-absorbed q.k (qk_head_dim ** -0.5, YaRN's mscale folded in)
    prefix: str

    def cache_spec(self) -> LatentCacheSpec:
        return LatentCacheSpec(self.kv_lora_rank + self.rope_dim)


class MLALayer(Protocol):
    """What an attention backend's make_mla_layer returns (the frontend in layers/mla.py calls it)."""

    def __call__(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """Absorbed: q [T, H, R + P], kv_c [T, R] (normed latent), k_pe [T, P] (rotated) -> [T, H, R]."""
        ...

    def wants_unabsorbed(self) -> bool:
        """Whether this forward should take unabsorbed() (a backend may always say no)."""
        ...

    def unabsorbed(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor
    ) -> torch.Tensor:
        """Fresh prefills: q, k [T, H, nope + P], v [T, H, V] (up-projected), kv_c / k_pe as in __call__
        (cached for later steps) -> [T, H, V]."""
        ...


def mla_step(
    q: torch.Tensor,
    kv_c: torch.Tensor | None,
    k_pe: torch.Tensor | None,
    cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    *,
    kv_lora_rank: int,
    softmax_scale: float,
    scale: torch.Tensor | None = None,
    kernel_backend: str | None = None,
) -> torch.Tensor:
    """One absorbed MLA layer's forward over a paged latent cache: write this forward's latent rows, then
    attend. q: [T, H, R + P]; kv_c: [T, R] (normed latent), k_pe: [T, P] (rotated), or both None when the
    caller wrote the rows; cache: [blocks, block_size, R + P]; scale: fp8 caches' per-tensor scale.
    Returns [T, H, R]."""
    if kv_c is not None:
        write_latent(kv_c, k_pe, cache, meta.slot_mapping, scale=scale, backend=kernel_backend)
    return mla_attention(
        q,
        cache,
        meta.cu_seqlens_q,
        meta.seq_lens,
        meta.block_tables,
        softmax_scale=softmax_scale,
        max_query_len=meta.max_query_len,
        kv_lora_rank=kv_lora_rank,
        scale=scale,
        backend=kernel_backend,
    )


def mla_unabsorbed_wanted(meta: PagedAttentionMetadata, min_tokens: int | None) -> bool:
    """Whether a forward takes mla_unabsorbed_step: only fresh prefills, the longest of min_tokens tokens
    or more (None: never)."""
    return min_tokens is not None and meta.prefill_only and meta.max_query_len >= min_tokens


def mla_unabsorbed_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    *,
    softmax_scale: float,
    scale: torch.Tensor | None = None,
    kernel_backend: str | None = None,
) -> torch.Tensor:
    """Fresh prefills on up-projected K/V: q, k [T, H, nope + P], v [T, H, V]; the latent rows (kv_c, k_pe
    as in mla_step) are written for the steps after it. Returns [T, H, V]."""
    write_latent(kv_c, k_pe, cache, meta.slot_mapping, scale=scale, backend=kernel_backend)
    # On a GPU torch's SDPA (flash / cuDNN), which outruns atom-kernels' Triton varlen path at these head
    # widths (benchmarks/bench_mla_prefill.py and its ledger). Elsewhere the engine's kernel backend (the
    # interpreter's tests take Triton).
    backend = "torch" if q.is_cuda else kernel_backend
    return varlen_causal_attention(
        q,
        k,
        v,
        cu_seqlens=meta.cu_seqlens_q,
        max_seq_len=meta.max_query_len,
        softmax_scale=softmax_scale,
        backend=backend,
    )


class MLAPagedLayer:
    """The native backend's MLA layer: mla_step over the engine's paged latent cache (mla_unabsorbed_step
    for a batch of fresh prefills whose longest has unabsorbed_min_tokens tokens; the attention then runs
    sequence by sequence, so many short prompts stay absorbed)."""

    def __init__(
        self, spec: MLALayerSpec, kernel_backend: str | None, unabsorbed_min_tokens: int | None = None
    ):
        self.spec = spec
        self.kernel_backend = kernel_backend
        self.unabsorbed_min_tokens = unabsorbed_min_tokens  # None: never

    def _bound(self) -> tuple[LatentCache, PagedAttentionMetadata]:
        ctx = current_forward_context()
        return ctx.caches[self.spec.layer_index], ctx.metadata_for(PAGED)

    def __call__(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """q: [T, H, R + P] (absorbed), kv_c: [T, R] (normed latent), k_pe: [T, P] (rotated) -> [T, H, R]."""
        cache, meta = self._bound()
        return mla_step(
            q,
            kv_c,
            k_pe,
            cache.rows,
            meta,
            kv_lora_rank=self.spec.kv_lora_rank,
            softmax_scale=self.spec.scale,
            scale=cache.scale,
            kernel_backend=self.kernel_backend,
        )

    def wants_unabsorbed(self) -> bool:
        return mla_unabsorbed_wanted(
            current_forward_context().metadata_for(PAGED), self.unabsorbed_min_tokens
        )

    def unabsorbed(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor
    ) -> torch.Tensor:
        cache, meta = self._bound()
        return mla_unabsorbed_step(
            q,
            k,
            v,
            kv_c,
            k_pe,
            cache.rows,
            meta,
            softmax_scale=self.spec.scale,
            scale=cache.scale,
            kernel_backend=self.kernel_backend,
        )
