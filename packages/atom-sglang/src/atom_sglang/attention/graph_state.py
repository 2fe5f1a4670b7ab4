"""Static metadata buffers for SGLang's decode CUDA graphs.

A captured graph keeps the addresses its kernels read, so every replay refills the same buffers in place
(outside the graph) and the kernel launch shapes do not depend on the batch: the page table spans the
whole context and max_seq_len is the context length. Padded rows carry SGLang's fill values (request 0,
seq_len 1, slot 0 on the pool's reserved padding page), which are valid reads and a harmless write.
"""

from __future__ import annotations

import torch

from atom_core.integration import PagedAttentionMetadata
from atom_sglang.attention.metadata import AtomForwardMetadata, verify_tokens_per_request


class DecodeGraphState:
    def __init__(self, max_bs: int, max_num_tokens: int, max_context_len: int, page_size: int, device):
        self.page_size = page_size
        self.max_context_len = max_context_len
        pages = -(-max_context_len // page_size)
        self.block_tables = torch.zeros(max_bs, pages, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)

    def update(self, forward_batch, req_to_token: torch.Tensor) -> AtomForwardMetadata:
        """Refill the buffers for a (padded) decode or chain-verify batch; returns metadata viewing them."""
        fb = forward_batch
        bs = fb.batch_size
        verify = fb.forward_mode.is_target_verify()
        n = verify_tokens_per_request(fb.spec_info) if verify else 1
        rows = req_to_token.index_select(0, fb.req_pool_indices[:bs].long())[:, :: self.page_size]
        self.block_tables[:bs, : rows.shape[1]].copy_(rows // self.page_size if self.page_size > 1 else rows)
        self.seq_lens[:bs].copy_(fb.seq_lens[:bs] + (n if verify else 0))  # verify: the drafts are new tokens
        torch.arange(0, (bs + 1) * n, n, out=self.cu_seqlens_q[: bs + 1])
        tokens = fb.out_cache_loc.shape[0]
        self.slot_mapping[:tokens].copy_(fb.out_cache_loc)
        paged = PagedAttentionMetadata(
            cu_seqlens_q=self.cu_seqlens_q[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            slot_mapping=self.slot_mapping[:tokens],
            max_query_len=n,
            max_seq_len=self.max_context_len + n,
            uniform_query_len=n,
        )
        return AtomForwardMetadata(paged)
