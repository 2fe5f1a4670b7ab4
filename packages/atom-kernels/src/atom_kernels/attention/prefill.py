"""Paged prefill / extend: varlen causal attention of new tokens against their sequence's whole cache."""

from __future__ import annotations

import torch

from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.launch import TileConfig, check_inputs, on_gpu, run_paged_attention
from atom_kernels.attention.prefill_tma import run_tma_prefill, tma_prefill_fits
from atom_kernels.cache.layout import KVLayout
from atom_kernels.settings import Backend, resolve_backend


def prefill_config(head_dim: int, gpu: bool) -> TileConfig:
    if not gpu:
        return TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)
    if head_dim > 128:
        return TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    return TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=2)  # benchmarks/sweep_tiles.py


TMA_CONFIG = TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)  # benchmarks/sweep_tiles.py


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    layout: KVLayout | str = KVLayout.FLASH,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Causal attention of new query tokens against everything cached for their sequence.

    q: [T, Hq, D], sequences back to back (cu_seqlens_q: [B+1] int32); the cache already holds each
    sequence's seq_lens[b] tokens, its q_len new ones last, so a prefix-cached or chunked prefill is the
    same call as a plain one. block_tables: [B, max_pages] int32; max_query_len: the largest q_len (host
    int). Other arguments as in paged_decode. Returns out [T, Hq, D].

    On Hopper and newer GPUs a 16-bit flash cache whose pages hold whole 64-position tiles is read with
    TMA copies (prefill_tma.py); every other call takes the generic tile kernel.
    """
    call = PagedCall(
        q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, layout, softmax_scale, sliding_window,
        softcap, sinks, k_scale, v_scale, out,
    )  # fmt: skip
    c = None
    if resolve_backend(backend, q.device) is Backend.TRITON:
        c = check_inputs(call)
        if tma_prefill_fits(call, c, TMA_CONFIG.block_n):
            return run_tma_prefill(call, c, max_query_len=max_query_len, config=TMA_CONFIG)
    config = prefill_config(q.shape[-1], on_gpu(q))
    return run_paged_attention(
        call, max_query_len=max_query_len, backend=backend, num_splits=1, config=config, checked=c
    )
