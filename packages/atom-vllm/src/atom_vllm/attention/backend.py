"""The vLLM attention backend "ATOM": ATOM's paged-attention kernels behind vLLM's backend interface."""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionType

BACKEND_NAME = "ATOM"


class AtomAttentionBackend(AttentionBackend):
    """Decoder self-attention over vLLM's paged KV cache, any page size, any head size, any cache layout.

    vLLM stores K and V of a token-head side by side in one per-layer buffer; ATOM's kernels address it
    through strided flash-layout views (atom-kernels' flash layout accepts any strides with a unit last
    one), so every layout vLLM can choose works and no copy is made. The forward writes the KV cache
    itself (forward_includes_kv_cache_update).
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls():
        from atom_vllm.attention.impl import AtomAttentionImpl

        return AtomAttentionImpl

    @staticmethod
    def get_builder_cls():
        from atom_vllm.attention.metadata import AtomAttentionMetadataBuilder

        return AtomAttentionMetadataBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return True
