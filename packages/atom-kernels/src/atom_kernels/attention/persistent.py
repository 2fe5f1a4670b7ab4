"""Persistent decode: a fixed set of programs shares the whole batch's KV blocks evenly (partition.py).

Where split-KV gives every sequence the same number of splits, this balances by work: one 32k sequence
among many short ones is spread over many programs instead of holding one up. The plan is computed on
the GPU into preallocated buffers, so plan + decode + combine can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton

from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.launch import check_inputs, check_shuffle_tile
from atom_kernels.attention.packs import Partials, kv_format, paged_kv, query_rows, scoring
from atom_kernels.attention.partition import DecodePartition, plan_decode
from atom_kernels.attention.persistent_kernel import combine_partials_kernel, persistent_decode_kernel
from atom_kernels.attention.ref import paged_attention_ref
from atom_kernels.cache.layout import KVLayout
from atom_kernels.settings import Backend, resolve_backend


def paged_decode_persistent(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    partition: DecodePartition,
    layout: KVLayout | str = KVLayout.FLASH,
    softmax_scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    plan: bool = True,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Decode one token per sequence over the paged cache with a work-balanced persistent grid.

    q: [B, Hq, D]; seq_lens: [B] int32 (>= 1, new token included); block_tables: [B, max_pages] int32;
    partition: buffers from DecodePartition.allocate (B <= its max_batch). plan=False reuses the plan
    already made for these seq_lens. Other arguments as in paged_decode (no sliding window here: use
    paged_decode for it). Returns out [B, Hq, D].
    """
    batch = seq_lens.numel()
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    call = PagedCall(
        q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, layout, softmax_scale, None, softcap,
        sinks, k_scale, v_scale, out,
    )  # fmt: skip
    c = check_inputs(call)
    if q.shape[0] != batch:
        raise ValueError(
            f"persistent decode takes one query token per sequence: q has {q.shape[0]}, B={batch}"
        )
    num_q_heads = q.shape[1]
    if partition.part_o.shape[1:] != (num_q_heads, c.head_dim):
        raise ValueError(f"partition buffers are for {tuple(partition.part_o.shape[1:])}, not [Hq, D]")
    check_shuffle_tile(c.layout, partition.block, k_cache.dtype)
    if resolve_backend(backend, q.device) is Backend.TORCH:
        return c.out.copy_(paged_attention_ref(call))
    if batch == 0:
        return c.out
    if plan:
        plan_decode(seq_lens, partition)
    group = num_q_heads // c.num_kv_heads
    gpu = q.is_cuda
    scores = scoring(c.softmax_scale, softcap, None, sinks, q)
    parts = Partials(partition.part_o, partition.part_lse)
    plan_bufs = (partition.cu_blocks, partition.per_program, partition.partial_base)
    persistent_decode_kernel[(partition.num_programs, c.num_kv_heads)](
        query_rows(q, c.out), paged_kv(c.layout, k_cache, v_cache, block_tables, c, k_scale, v_scale), scores,
        parts, seq_lens, *plan_bufs, batch, num_q_heads,
        FMT=kv_format(c.layout, q, k_cache, v_cache, c.scale_kind), GROUP=group, HAS_SINKS=sinks is not None,
        HEAD_DIM=c.head_dim, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=partition.block,
        num_warps=2 if gpu else 1, num_stages=3 if gpu else 1,
    )  # fmt: skip
    combine_partials_kernel[(batch, num_q_heads)](
        parts, c.out, scores.sinks, *plan_bufs, c.out.stride(0), c.out.stride(1), num_q_heads,
        HAS_SINKS=sinks is not None, HEAD_DIM=c.head_dim, BLOCK_S=16,
        BLOCK_D=triton.next_power_of_2(c.head_dim),
    )  # fmt: skip
    return c.out
