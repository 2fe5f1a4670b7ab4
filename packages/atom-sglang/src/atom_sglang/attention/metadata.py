"""SGLang's ForwardBatch -> atom-core's PagedAttentionMetadata, on the device, without a host sync.

SGLang addresses KV by token slot: `req_to_token[req, pos]` is the slot of a request's token and slot
`s` lives at page `s // page_size`, offset `s % page_size`. Page-aligned allocation makes a request's
page table the slots of every page_size-th position, divided by page_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.integration import PagedAttentionMetadata


class UnsupportedForwardMode(NotImplementedError):
    pass


@dataclass(slots=True)
class AtomForwardMetadata:
    paged: PagedAttentionMetadata  # uniform_query_len set for decode (1) and chain verify (n)


def page_tables(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, page_size: int, max_seq_len: int
) -> torch.Tensor:
    """req_to_token: [R, max_context_len] int32 slots -> [B, ceil(max_seq_len / page_size)] int32 page ids."""
    width = min(-(-max_seq_len // page_size) * page_size, req_to_token.shape[1])
    rows = req_to_token.index_select(0, req_pool_indices.long())[:, :width:page_size]
    return (rows // page_size if page_size > 1 else rows).to(torch.int32)


def verify_tokens_per_request(spec_info) -> int:
    """Draft tokens each request verifies; only chains (topk 1) are causal, which the kernels compute."""
    topk = getattr(spec_info, "topk", 1)
    if topk != 1:
        raise UnsupportedForwardMode(
            f"the atom attention backend verifies chain drafts only (speculative topk 1), got topk {topk}: "
            "tree drafts need a custom mask; run with --speculative-eagle-topk 1 or another backend"
        )
    n = getattr(spec_info, "num_tokens_per_req", -1)
    return n if n > 0 else spec_info.draft_token_num


def build_metadata(forward_batch, req_to_token: torch.Tensor, page_size: int) -> AtomForwardMetadata:
    """One forward's metadata for decode, extend/mixed (chunked and prefix-cached), chain target-verify and
    draft-extend."""
    fb, mode = forward_batch, forward_batch.forward_mode
    bs = fb.batch_size
    device = fb.seq_lens.device
    host_max = int(fb.seq_lens_cpu.max()) if fb.seq_lens_cpu is not None and bs else req_to_token.shape[1]
    if mode.is_decode() or mode.is_target_verify():
        n = verify_tokens_per_request(fb.spec_info) if mode.is_target_verify() else 1
        seq_lens = fb.seq_lens.to(torch.int32) + (n if mode.is_target_verify() else 0)
        max_seq_len = host_max + (n if mode.is_target_verify() else 0)
        cu = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=device)
        max_query_len, query_len = n, n
    elif mode.name in ("EXTEND", "MIXED", "DRAFT_EXTEND_V2"):
        # DRAFT_EXTEND_V2 (a draft re-reading a verify window): every request extends num_draft_tokens,
        # seq_lens already count them; causal like any extend.
        seq_lens, max_seq_len = fb.seq_lens.to(torch.int32), host_max
        cu = torch.zeros(bs + 1, dtype=torch.int32, device=device)
        cu[1:] = torch.cumsum(fb.extend_seq_lens, 0)
        max_query_len, query_len = max(fb.extend_seq_lens_cpu), None
    else:
        raise UnsupportedForwardMode(
            f"the atom attention backend does not run SGLang forward mode {mode.name}; "
            "it runs EXTEND, MIXED, DECODE, IDLE, TARGET_VERIFY (chain drafts) and DRAFT_EXTEND_V2"
        )
    paged = PagedAttentionMetadata(
        cu_seqlens_q=cu,
        seq_lens=seq_lens,
        block_tables=page_tables(req_to_token, fb.req_pool_indices, page_size, max_seq_len),
        slot_mapping=fb.out_cache_loc.to(torch.int64),
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        uniform_query_len=query_len,
    )
    return AtomForwardMetadata(paged)
