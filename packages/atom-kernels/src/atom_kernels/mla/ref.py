"""Pure-torch references for MLA (multi-head latent attention) over a paged latent cache.

The cache holds, per token, the compressed kv (kv_lora_rank, 512 in DeepSeek-V2/V3) followed by the
decoupled rope key (64): one row of 576 values per token, pages of `block_size` rows: [N, B, 576].
With the absorbed formulation, q [T, Hq, 576] (q_nope already multiplied by W_UK, then q_pe) scores
every cached row, and the output is the probability-weighted sum of the rows' first 512 values.
"""

from __future__ import annotations

import torch

from atom_kernels.mla.call import MlaCall


def write_latent_ref(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: torch.Tensor | None = None,
) -> None:
    """cache[slot] = concat(kv_c, k_pe) for each token with slot >= 0 (/ scale, saturated, for fp8)."""
    rows = cache.view(-1, cache.shape[-1])
    keep = slot_mapping >= 0
    value = torch.cat([kv_c, k_pe], dim=-1)[keep].float()
    if scale is not None:
        limit = float(torch.finfo(cache.dtype).max)
        value = (value / scale.float()).clamp(-limit, limit)
    rows[slot_mapping[keep].long()] = value.to(cache.dtype)


def read_latent_ref(cache: torch.Tensor, block_table: torch.Tensor, length: int, scale=None) -> torch.Tensor:
    """The first `length` rows of one sequence, [length, 576] float64 (dequantized with scale)."""
    block_size = cache.shape[1]
    pages = block_table[: -(-length // block_size)].long()
    rows = cache[pages].reshape(-1, cache.shape[-1])[:length].double()
    return rows * float(scale) if scale is not None else rows


def mla_attention_ref(call: MlaCall) -> torch.Tensor:
    """Absorbed MLA of new query tokens against their sequence's paged latent rows (float64 math).

    q: [T, Hq, 576]; each sequence's queries are its last q_len of seq_lens[b] cached tokens, so query i
    sees rows at positions <= seq_len - q_len + i (decode: all of them). Returns [T, Hq, kv_lora_rank].
    """
    q, cache, cu_seqlens_q, seq_lens = call.q, call.cache, call.cu_seqlens_q, call.seq_lens
    kv_lora_rank = call.kv_lora_rank
    out = torch.empty(q.shape[0], q.shape[1], kv_lora_rank, dtype=q.dtype, device=q.device)
    for b in range(seq_lens.numel()):
        start, end = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        kv_len, q_len = int(seq_lens[b]), end - start
        if q_len == 0:
            continue
        rows = read_latent_ref(cache, call.block_tables[b], kv_len, call.scale)  # [L, 576]
        scores = torch.einsum("thd,ld->thl", q[start:end].double(), rows) * call.softmax_scale
        position = torch.arange(kv_len, device=q.device)
        limit = kv_len - q_len + torch.arange(q_len, device=q.device)
        scores = scores.masked_fill(position[None, None, :] > limit[:, None, None], float("-inf"))
        out[start:end] = torch.einsum("thl,ld->thd", scores.softmax(-1), rows[:, :kv_lora_rank]).to(q.dtype)
    return out
