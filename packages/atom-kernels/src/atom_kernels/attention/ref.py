"""Pure-torch reference for paged attention (prefill, extend and decode are one computation)."""

from __future__ import annotations

import torch

from atom_kernels.attention.call import PagedCall
from atom_kernels.cache.ref import read_kv_ref


def paged_attention_ref(call: PagedCall) -> torch.Tensor:
    """Attention of a call's new query tokens against their sequence's paged KV (float64 math).

    q: [T, Hq, D], the query tokens of all sequences back to back (cu_seqlens_q: [B+1]); each sequence's
    queries are its last q_len tokens of seq_lens[b] tokens already in the cache, so query i sits at
    position seq_len - q_len + i and sees keys at positions <= its own (and, with sliding_window W,
    > its own - W). softcap: scores -> softcap * tanh(scores / softcap). sinks: [Hq] logits that join
    each softmax's denominator and take no value. call.out is not written. Returns [T, Hq, D] in q's
    dtype.
    """
    q, k_cache, v_cache, block_tables = call.q, call.k_cache, call.v_cache, call.block_tables
    cu_seqlens_q, seq_lens, layout = call.cu_seqlens_q, call.seq_lens, call.layout
    softcap, sliding_window, sinks = call.softcap, call.sliding_window, call.sinks
    softmax_scale = call.softmax_scale
    _, num_q_heads, head_dim = q.shape
    scale = softmax_scale if softmax_scale is not None else head_dim**-0.5
    out = torch.empty_like(q)
    for b in range(seq_lens.numel()):
        start, end = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        kv_len, q_len = int(seq_lens[b]), end - start
        if q_len == 0:
            continue
        k, v = read_kv_ref(k_cache, v_cache, block_tables[b], kv_len, layout, call.k_scale, call.v_scale)
        group = num_q_heads // k.shape[1]
        k = k.double().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].double(), k) * scale  # [Hq, q_len, L]
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)[:, None]
        k_pos = torch.arange(kv_len, device=q.device)[None, :]
        visible = k_pos <= q_pos
        if sliding_window is not None:
            visible &= k_pos > q_pos - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sink = sinks.double()[:, None, None].expand(-1, q_len, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out
