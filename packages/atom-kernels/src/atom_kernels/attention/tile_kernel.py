"""The generic paged-attention kernel: one tile kernel for prefill, extend and decode, and its split combiner.

Grid (tiles x NUM_SPLITS, batch, kv heads). A program takes one tile of a sequence's query tokens (tile.py)
and its share of the KV positions those tokens see. With NUM_SPLITS > 1 (split-KV decode) each program
writes a partial output and its log-sum-exp, which combine_splits_kernel merges.
"""

import triton
import triton.language as tl

from atom_kernels.attention.packs import DERIVED_TILED
from atom_kernels.attention.tile import LOG2E, attend_span, normalize, tile_rows
from atom_kernels.pdl import let_next_launch, wait_for_inputs


@triton.heuristics(DERIVED_TILED)
@triton.jit
def paged_attention_kernel(
    rows,
    kv,
    scores,
    parts,
    seq_lens_ptr,
    cu_q_ptr,
    num_q_heads,
    FMT: tl.constexpr,
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
    TOKENS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP16_COMPUTE: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """rows: packs.QueryRows; kv: packs.PagedKV; scores: packs.Scoring; parts: packs.Partials (unused with
    one split); seq_lens [B], cu_q [B+1] int32. The last six constexprs follow from the rest (DERIVED_TILED)."""
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    pid = tl.program_id(0)
    seq = tl.program_id(1)
    kvh = tl.program_id(2)
    tile = tl.num_programs(0) // NUM_SPLITS - 1 - pid // NUM_SPLITS  # longest (causal) tiles first
    split = pid % NUM_SPLITS
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    kv_len = tl.load(seq_lens_ptr + seq)  # with the two above: one round trip, not two after the branch
    tok0 = tile * TOKENS
    if tok0 >= q_len:
        return

    head, row_ok, q_pos, t_idx = tile_rows(tok0, q_start, q_len, kv_len, kvh, GROUP, TOKENS, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    io_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)

    # This tile's KV positions [kv_start, kv_end), this split's share of them, and the part of that
    # share every row sees (no masks needed there).
    first_pos = kv_len - q_len + tok0
    kv_end = kv_len - q_len + tl.minimum(tok0 + TOKENS, q_len)
    kv_start = 0
    if HAS_WINDOW:
        kv_start = tl.maximum(first_pos - scores.window + 1, 0)
        if FMT.LAYOUT == 1:  # whole V runs (see tile.attend); the window mask hides the extra positions
            kv_start = kv_start // FMT.X * FMT.X
    per_split = tl.cdiv(tl.cdiv(kv_end - kv_start, BLOCK_N), NUM_SPLITS) * BLOCK_N
    n_start = kv_start + split * per_split
    n_end = tl.minimum(n_start + per_split, kv_end)
    if NUM_SPLITS > 1:  # noqa: SIM102 (a compile-time branch: one split has no partials)
        if n_start >= n_end:  # a split past a short sequence's end: an empty share, and no o to write
            part = (t_idx * num_q_heads + head) * NUM_SPLITS + split
            tl.store(parts.lse + part, tl.full((BLOCK_M,), float("-inf"), tl.float32), mask=row_ok)
            return
    q_off = t_idx[:, None] * rows.stride_qt + head[:, None] * rows.stride_qh + d[None, :]
    q = tl.load(rows.q + q_off, mask=io_mask, other=0.0)
    if FP16_COMPUTE:
        q = q.to(tl.float16)
    if HAS_WINDOW:
        full_end = n_start
    else:
        full_end = n_start + tl.maximum(tl.minimum(n_end, first_pos + 1) - n_start, 0) // BLOCK_N * BLOCK_N

    table_ptr = kv.block_tables + seq.to(tl.int64) * kv.stride_bt
    acc, l_i, m_i = attend_span(
        q, q_pos, kv, table_ptr, n_start, full_end, n_end, kvh, scores,
        FMT, HAS_SOFTCAP, HAS_WINDOW, DOT_PRECISION, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D,
    )  # fmt: skip

    if NUM_SPLITS == 1:
        o = normalize(acc, l_i, m_i, scores.sinks, head, row_ok, HAS_SINKS)
        out_off = t_idx[:, None] * rows.stride_ot + head[:, None] * rows.stride_oh + d[None, :]
        tl.store(rows.out + out_off, o.to(rows.out.dtype.element_ty), mask=io_mask)
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))  # log2 units
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        part = (t_idx * num_q_heads + head) * NUM_SPLITS + split
        tl.store(parts.lse + part, lse, mask=row_ok)
        tl.store(parts.o + part[:, None] * HEAD_DIM + d[None, :], o, mask=io_mask)


@triton.jit
def combine_splits_kernel(
    parts,
    out_ptr,
    sinks_ptr,
    stride_ot,
    stride_oh,
    num_q_heads,
    NUM_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[t, h] = sum_s exp(lse_s) o_s / (sum_s exp(lse_s) + exp(sink_h)), over the splits of (t, h)."""
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    base = (t * num_q_heads + h) * NUM_SPLITS
    lse = tl.load(parts.lse + base + s, mask=s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h) * LOG2E
        m = tl.maximum(m, sink)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    if HAS_SINKS:
        denom += tl.exp2(sink - m)
    # Empty splits (lse -inf) wrote no o: what their rows hold is selected away, not weighed (it may be
    # NaN). o's load does not wait for lse's, so the two take one round trip.
    mask = (s[:, None] < NUM_SPLITS) & (d[None, :] < HEAD_DIM)
    o = tl.load(parts.o + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
    o = tl.where(lse[:, None] > float("-inf"), o, 0.0)
    out = tl.sum(w[:, None] * o, 0) / denom
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)
