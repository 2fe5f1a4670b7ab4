"""Persistent decode kernels: programs that share the batch's KV blocks evenly (partition.py), and the
combiner of the sequences they split."""

import triton
import triton.language as tl

from atom_kernels.attention.packs import DERIVED
from atom_kernels.attention.tile import LOG2E, attend_span


@triton.heuristics(DERIVED)
@triton.jit
def persistent_decode_kernel(
    rows,
    kv,
    scores,
    parts,
    seq_lens_ptr,
    cu_ptr,
    per_ptr,
    base_ptr,
    batch,
    num_q_heads,
    FMT: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP16_COMPUTE: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (p, kv head) decodes its share of the partition (see partition.py): one token per sequence.

    Packs as in tile_kernel.paged_attention_kernel; cu_ptr, per_ptr, base_ptr: the partition's cumulative
    blocks [B+1], blocks per program [1] and each split sequence's first partial slot [B] (-1: whole)."""
    p = tl.program_id(0)
    kvh = tl.program_id(1)
    per = tl.load(per_ptr)
    start = p * per
    end = tl.minimum(start + per, tl.load(cu_ptr + batch))
    if start >= end:
        return
    lo = tl.full((), 0, tl.int32)  # binary search: the first sequence whose blocks reach past `start`
    hi = tl.full((), 0, tl.int32) + batch - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_ptr + mid + 1) > start:
            hi = mid
        else:
            lo = mid + 1

    r = tl.arange(0, BLOCK_M)
    head = kvh * GROUP + r % GROUP
    row_ok = r < GROUP
    d = tl.arange(0, BLOCK_D)
    io_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    b = lo
    blk = start
    while blk < end:
        seq_first = tl.load(cu_ptr + b)
        seq_last = tl.load(cu_ptr + b + 1)
        seg_lo = tl.maximum(blk, seq_first)
        seg_hi = tl.minimum(end, seq_last)
        kv_len = tl.load(seq_lens_ptr + b)
        n_start = (seg_lo - seq_first) * BLOCK_N
        n_end = tl.minimum((seg_hi - seq_first) * BLOCK_N, kv_len)
        full_end = n_start + (n_end - n_start) // BLOCK_N * BLOCK_N
        t_idx = b.to(tl.int64)
        q_off = t_idx * rows.stride_qt + head[:, None] * rows.stride_qh + d[None, :]
        q = tl.load(rows.q + q_off, mask=io_mask, other=0.0)
        if FP16_COMPUTE:
            q = q.to(tl.float16)
        q_pos = tl.zeros((BLOCK_M,), dtype=tl.int32) + kv_len - 1
        table_ptr = kv.block_tables + t_idx * kv.stride_bt
        acc, l_i, m_i = attend_span(
            q, q_pos, kv, table_ptr, n_start, full_end, n_end, kvh, scores,
            FMT, HAS_SOFTCAP, False, DOT_PRECISION, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D,
        )  # fmt: skip
        whole = (seg_lo == seq_first) & (seg_hi == seq_last)
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        o = acc / l_safe[:, None]
        # A sequence this program holds whole is written out; a share of a split one is a partial.
        if HAS_SINKS:
            sink = tl.load(scores.sinks + head, mask=row_ok, other=0.0) * LOG2E
            m_fin = tl.maximum(m_i, sink)
            l_fin = l_i * tl.exp2(m_i - m_fin) + tl.exp2(sink - m_fin)
            o_fin = acc * (tl.exp2(m_i - m_fin) / l_fin)[:, None]
        else:
            o_fin = o
        out_off = t_idx * rows.stride_ot + head[:, None] * rows.stride_oh + d[None, :]
        tl.store(rows.out + out_off, o_fin.to(rows.out.dtype.element_ty), mask=io_mask & whole)
        slot = (tl.load(base_ptr + b) + p - seq_first // per).to(tl.int64)
        part = slot * num_q_heads + head
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(parts.lse + part, lse, mask=row_ok & (whole == 0))
        tl.store(parts.o + part[:, None] * HEAD_DIM + d[None, :], o, mask=io_mask & (whole == 0))
        blk = seg_hi
        b += 1


@triton.jit
def combine_partials_kernel(
    parts,
    out_ptr,
    sinks_ptr,
    cu_ptr,
    per_ptr,
    base_ptr,
    stride_ot,
    stride_oh,
    num_q_heads,
    HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Merge the partials of each split sequence (program (b, q head)); whole sequences are already out."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    base = tl.load(base_ptr + b)
    if base < 0:
        return
    per = tl.load(per_ptr)
    first = tl.load(cu_ptr + b)
    count = (tl.load(cu_ptr + b + 1) - 1) // per - first // per + 1
    d = tl.arange(0, BLOCK_D)
    m = tl.full((), float("-inf"), dtype=tl.float32)
    denom = tl.full((), 0.0, dtype=tl.float32)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for s0 in range(0, count, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ok = s < count
        part = (base + s).to(tl.int64) * num_q_heads + h
        lse = tl.load(parts.lse + part, mask=ok, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, 0))
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        o = tl.load(
            parts.o + part[:, None] * HEAD_DIM + d[None, :],
            mask=ok[:, None] & (d[None, :] < HEAD_DIM),
            other=0.0,
        )
        acc = acc * alpha + tl.sum(w[:, None] * o, 0)
        denom = denom * alpha + tl.sum(w, 0)
        m = m_new
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h) * LOG2E
        m_new = tl.maximum(m, sink)
        alpha = tl.exp2(m - m_new)
        acc = acc * alpha
        denom = denom * alpha + tl.exp2(sink - m_new)
    out_off = b.to(tl.int64) * stride_ot + h * stride_oh + d
    tl.store(out_ptr + out_off, (acc / denom).to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)
