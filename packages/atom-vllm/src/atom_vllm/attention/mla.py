"""ATOM's multi-head latent attention under vLLM: an attention layer of the adapter's own over vLLM's latent
cache, and the "ATOM_MLA" backend that names its metadata builder.

vLLM allocates and binds one paged latent cache per MLA layer ([blocks, block_size, kv_lora_rank + rope],
MLAAttentionSpec) and builds the step's metadata with the backend's builder; the layer writes the step's
latent rows and attends through atom-core's mla_step. The frontend (atom-core's layers/mla.py) absorbs the
up-projections, so this layer sees absorbed queries and returns latent outputs, any latent width (vLLM's
common MLA builder accepts only 320, 512 and 576). The layer is found by vLLM through
`static_forward_context` like its own attention layers; nothing in vLLM is patched.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from atom_core.integration import MLALayerSpec, mla_step
from atom_vllm.attention.backend import AtomAttentionBackend
from atom_vllm.attention.metadata import AtomAttentionMetadata
from atom_vllm.attention.opaque import MLA_OP, mla_attention_op, register_opaque_layer

MLA_BACKEND_NAME = "ATOM_MLA"


class AtomMLABackend(AtomAttentionBackend):
    """Latent attention over vLLM's paged latent cache (one row of kv_lora_rank + rope per token); dtypes,
    attention types and builder as the MHA backend's."""

    @staticmethod
    def get_name() -> str:
        return MLA_BACKEND_NAME

    @staticmethod
    def get_impl_cls():
        return AtomMLAImpl

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False


class AtomMLAImpl(AttentionImpl[AtomAttentionMetadata]):
    """vLLM's backend interface asks for an impl class; ATOM's MLA layer runs the attention itself."""

    def __init__(self, *args, **kwargs) -> None:
        raise NotImplementedError(
            "ATOM_MLA runs inside ATOM's own MLA layer (VllmMLALayer); vLLM's MLAAttention cannot use it"
        )

    def forward(self, *args, **kwargs):  # pragma: no cover - never constructed
        raise NotImplementedError


class VllmMLALayer(nn.Module, AttentionLayerBase):
    """atom-core's MLALayer contract over vLLM's latent cache: (q [T, H, R + P], kv_c [T, R], k_pe [T, P])
    -> [T, H, R], the latent rows written first. Absorbed always (no un-absorbed prefill under vLLM yet)."""

    def __init__(self, spec: MLALayerSpec):
        super().__init__()
        self.spec = spec
        self.layer_name = spec.prefix
        self.num_heads = spec.num_heads
        self.head_size = spec.kv_lora_rank + spec.rope_dim
        vllm_config = get_current_vllm_config()
        self.kv_cache_dtype = vllm_config.cache_config.cache_dtype
        if self.kv_cache_dtype != "auto":
            raise NotImplementedError(
                f"ATOM's MLA under vLLM keeps the latent cache in the model's dtype; got kv_cache_dtype "
                f"{self.kv_cache_dtype!r} (supported: auto)"
            )
        self.kv_cache = torch.tensor([])  # bound by vLLM's runner
        self.attn_backend, self.sliding_window = AtomMLABackend, None  # what diagnostics report
        register_opaque_layer(vllm_config, self, MLA_OP)

    def get_attn_backend(self) -> type[AttentionBackend]:
        return AtomMLABackend

    def get_kv_cache_spec(self, vllm_config) -> MLAAttentionSpec:
        return MLAAttentionSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=1,
            head_size=self.head_size,
            dtype=vllm_config.model_config.dtype,
            cache_dtype_str=self.kv_cache_dtype,
        )

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache.squeeze(1)  # [blocks, 1, block_size, R + P] -> [blocks, block_size, R + P]

    def _metadata(self) -> AtomAttentionMetadata | None:
        metadata = get_forward_context().attn_metadata
        if metadata is None:
            return None
        if isinstance(metadata, list):  # micro-batches: not used by ATOM's models
            raise NotImplementedError("ATOM's MLA under vLLM does not run micro-batched (DBO) steps")
        return metadata.get(self.layer_name)

    def forward(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """q: [T, H, R + P] (absorbed), kv_c: [T, R] (normed latent), k_pe: [T, P] (rotated) -> [T, H, R].
        One opaque op when vLLM compiles the model (opaque.py)."""
        if torch.compiler.is_compiling():
            return mla_attention_op(q, kv_c, k_pe, self.layer_name)
        return self.run(q, kv_c, k_pe)

    def run(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """The step: write the latent rows, attend over the cache (forward's contract)."""
        meta = self._metadata()
        out = q.new_zeros(q.shape[0], self.num_heads, self.spec.kv_lora_rank)
        if meta is None:  # vLLM's profiling and dummy runs
            return out
        n = meta.num_actual_tokens
        out[:n] = mla_step(
            q[:n],
            kv_c[:n],
            k_pe[:n],
            self.kv_cache,
            meta.paged,
            kv_lora_rank=self.spec.kv_lora_rank,
            softmax_scale=self.spec.scale,
        )
        return out

    def wants_unabsorbed(self) -> bool:
        return False

    def unabsorbed(self, *args):  # never asked for: wants_unabsorbed() is False
        raise NotImplementedError("ATOM's MLA under vLLM runs absorbed only")
