"""Per-step attention metadata: vLLM's CommonAttentionMetadata as atom-core's PagedAttentionMetadata."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder, CommonAttentionMetadata

from atom_core.integration import PagedAttentionMetadata


@dataclass(slots=True)
class AtomAttentionMetadata:
    paged: PagedAttentionMetadata  # covers the first num_actual_tokens tokens
    num_actual_tokens: int  # vLLM may pad the batch's token count; rows past this are left alone


class AtomAttentionMetadataBuilder(AttentionMetadataBuilder[AtomAttentionMetadata]):
    # Eager only for now: decode CUDA graphs under vLLM are untested (the GPU machine has no vLLM).
    _cudagraph_support = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> AtomAttentionMetadata:
        m = common_attn_metadata
        tokens = m.num_actual_tokens
        # vLLM's seq_lens count the tokens in the cache after this step's writes, and each request's
        # new tokens are its last ones: atom-core's convention too. All device tensors, no host sync.
        paged = PagedAttentionMetadata(
            cu_seqlens_q=m.query_start_loc,
            seq_lens=m.seq_lens,
            block_tables=m.block_table_tensor,
            slot_mapping=m.slot_mapping[:tokens],
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
        )
        return AtomAttentionMetadata(paged=paged, num_actual_tokens=tokens)
