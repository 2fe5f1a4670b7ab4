"""One paged-attention call's inputs, gathered once by each entry point (decode.py, prefill.py,
persistent.py) and read by the checks, the torch reference (ref.py) and the launches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_kernels.cache.layout import KVLayout


@dataclass(frozen=True, slots=True)
class PagedCall:
    """q [T, Hq, D] and the paged caches in `layout`, with cu_seqlens_q [B+1], seq_lens [B] and
    block_tables [B, max_pages] int32, and the options of paged_decode / paged_prefill."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    layout: KVLayout | str = KVLayout.FLASH
    softmax_scale: float | None = None
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    out: torch.Tensor | None = None
