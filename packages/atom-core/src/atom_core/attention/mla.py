"""Multi-head latent attention (MLA) through the backend seam, and the native backend's MLA layer.

The frontend (layers/mla.py) absorbs the key and value up-projections: each head's query reaches the
backend as [kv_lora_rank + rope] (the latent and rotary parts), every head reads the same cached latent
row of [kv_lora_rank + rope] per token, and the output stays latent ([kv_lora_rank] per head) until the
frontend maps it back through W_UV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.cache.allocate import LatentCache
from atom_core.cache.specs import PAGED, LatentCacheSpec
from atom_core.forward_context import current_forward_context
from atom_core.ops import mla_attention, write_latent


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


class MLAPagedLayer:
    """The native backend's MLA layer: writes the latent rows, then attends over the paged latent cache."""

    def __init__(self, spec: MLALayerSpec, kernel_backend: str | None):
        self.spec = spec
        self.kernel_backend = kernel_backend

    def __call__(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """q: [T, H, R + P] (absorbed), kv_c: [T, R] (normed latent), k_pe: [T, P] (rotated) -> [T, H, R]."""
        ctx = current_forward_context()
        meta = ctx.metadata_for(PAGED)
        cache: LatentCache = ctx.caches[self.spec.layer_index]
        write_latent(
            kv_c, k_pe, cache.rows, meta.slot_mapping, scale=cache.scale, backend=self.kernel_backend
        )
        return mla_attention(
            q,
            cache.rows,
            meta.cu_seqlens_q,
            meta.seq_lens,
            meta.block_tables,
            softmax_scale=self.spec.scale,
            max_query_len=meta.max_query_len,
            kv_lora_rank=self.spec.kv_lora_rank,
            scale=cache.scale,
            backend=self.kernel_backend,
        )
