"""Causal self-attention of fresh sequences packed back to back (no cache), K/V head dims may differ.

MLA's un-absorbed prefill: each head's q and k are [nope + rope] wide and v is [v_head_dim] (192 and 128
for DeepSeek-V3). The tokens' K and V are laid out as a paged cache of one-position pages whose block
table is the identity, so the paged prefill kernel runs them without a copy of K; V is zero-padded to
K's width (the padded output columns are dropped). The torch backend runs torch's SDPA sequence by
sequence in the inputs' dtype (flash / cuDNN on a GPU: several times this Triton path at 192/128,
atom-core's bench_mla_prefill.py).
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F

from atom_kernels.attention.prefill import paged_prefill
from atom_kernels.settings import Backend, resolve_backend


def varlen_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    max_seq_len: int,
    softmax_scale: float,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """q, k: [T, H, D]; v: [T, H, Dv] with Dv <= D; cu_seqlens: [B+1] int32 (sequence b is rows
    cu[b]:cu[b+1], positions from 0); max_seq_len: the longest sequence (host int). -> out [T, H, Dv]."""
    tokens, heads, width = q.shape
    v_width = v.shape[-1]
    if k.shape != q.shape or v.shape[:2] != q.shape[:2] or v_width > width:
        raise ValueError(
            f"q and k must be [T, H, D] and v [T, H, Dv <= D], got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if resolve_backend(backend, q.device) is Backend.TORCH:
        return _per_sequence_sdpa(q, k, v, cu_seqlens.tolist(), softmax_scale, q.dtype)
    k_pages = k.contiguous().view(tokens, 1, heads, width)
    v_pages = F.pad(v, (0, width - v_width)).view(tokens, 1, heads, width)
    seq_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int32)
    rows = torch.arange(max_seq_len, device=q.device, dtype=torch.int32)
    # sequence b's position p is page cu[b] + p; positions past its end are never read (clamped in range)
    tables = (cu_seqlens[:-1, None] + rows[None, :]).clamp_(max=max(tokens - 1, 0)).to(torch.int32)
    out = paged_prefill(
        q.contiguous(), k_pages, v_pages, cu_seqlens_q=cu_seqlens, seq_lens=seq_lens, block_tables=tables,
        max_query_len=max_seq_len, softmax_scale=softmax_scale, backend=backend,
    )  # fmt: skip
    return out[..., :v_width]


def varlen_causal_attention_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, cu_seqlens: torch.Tensor, softmax_scale: float
) -> torch.Tensor:
    """Sequence by sequence, in float32: softmax(q k^T * scale + causal mask) v."""
    return _per_sequence_sdpa(q, k, v, cu_seqlens.tolist(), softmax_scale, torch.float32)


def _per_sequence_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: list[int],
    softmax_scale: float,
    compute: torch.dtype,
) -> torch.Tensor:
    out = torch.empty(*q.shape[:2], v.shape[-1], dtype=q.dtype, device=q.device)
    for start, end in pairwise(bounds):
        if end > start:
            # [1, H, n, D]: batched 4-D inputs are what SDPA's flash / cuDNN kernels take (3-D fell back to
            # the math path, T x T scores in memory: 8x slower at 4k tokens)
            qs, ks, vs = (x[start:end].transpose(0, 1)[None].to(compute) for x in (q, k, v))
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=softmax_scale)
            out[start:end] = o[0].transpose(0, 1).to(q.dtype)
    return out
