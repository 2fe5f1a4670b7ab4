"""Triton kernels for paged attention: one tile kernel for prefill/extend/decode, and a split combiner.

A tile is up to TOKENS query tokens of one sequence times the GROUP q-heads that share one KV head
(GQA packing: rows r -> token r // GROUP, head r % GROUP), so K/V are read once for the whole group.
A program walks its share of the sequence's KV positions through the block table (any page size):
blocks every row can see run without masks, the causal edge and sliding window with them. With
NUM_SPLITS > 1 (split-KV decode) each program writes a partial output and its log-sum-exp.
"""

import triton
import triton.language as tl

from atom_kernels.cache.offsets import kv_offsets
from atom_kernels.pdl import let_next_launch, wait_for_inputs

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _load_e4m3_rows_as_f16(base_ptr, row_off, mask, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """[BLOCK_N, BLOCK_D] fp16 from e4m3 rows starting at base_ptr + row_off ([BLOCK_N, 1]), 16-byte aligned.

    Loaded as 32-bit words and converted four values at a time in the load's layout. Left to the compiler,
    the conversion would follow the MMA operand read from shared memory, which for V in the flash layout
    (D contiguous where the MMA wants positions) is one byte per load.
    """
    words = (
        base_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
        + row_off // 4
        + tl.arange(0, BLOCK_D // 4)[None, :]
    )
    words = tl.max_contiguous(tl.multiple_of(words, [1, 16]), [1, 4])  # the division hides the alignment
    w = tl.load(words, mask=mask, other=0)
    v0, v1, v2, v3 = tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; .reg .b32 a, b; mov.b32 {lo, hi}, $4; cvt.rn.f16x2.e4m3x2 a, lo;"
        " cvt.rn.f16x2.e4m3x2 b, hi; mov.b32 {$0, $1}, a; mov.b32 {$2, $3}, b; }",
        "=h,=h,=h,=h,r",
        [w],
        dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True,
        pack=1,
    )
    return tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), (BLOCK_N, BLOCK_D))


@triton.jit
def _tile_rows(
    tok0, q_start, q_len, kv_len, kvh, GROUP: tl.constexpr, TOKENS: tl.constexpr, BLOCK_M: tl.constexpr
):
    """A GQA-packed tile's rows (row r: token tok0 + r // GROUP, q-head kvh * GROUP + r % GROUP) ->
    (q-head, row valid, absolute position of the row's token, token index in q) per row."""
    rows = tl.arange(0, BLOCK_M)
    tok = tok0 + rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_ok = (rows < TOKENS * GROUP) & (tok < q_len)
    return head, row_ok, kv_len - q_len + tok, (q_start + tok).to(tl.int64)


@triton.jit
def _softmax_step(s, m_i, l_i):
    """Online softmax over one block of log2-scaled scores s: -> (p, rescale of the running sums, m, l)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _normalize(acc, l_i, m_i, sinks_ptr, head, row_ok, HAS_SINKS: tl.constexpr):
    """The finished rows' output acc / l, with each q-head's sink logit joining the denominator."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * LOG2E
        m_new = tl.maximum(m_i, sink)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.exp2(sink - m_new)
        acc = acc * alpha[:, None]
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit
def _attend(
    acc,
    l_i,
    m_i,
    q,
    q_pos,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    table_ptr,
    n_start,
    n_end,
    kvh,
    num_kv_heads,
    block_size,
    stride_cb,
    stride_cn,
    stride_ch,
    sm_scale,
    softcap,
    window,
    MASKED: tl.constexpr,
    LAYOUT: tl.constexpr,
    X: tl.constexpr,
    V_WORDS: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    d = tl.arange(0, BLOCK_D)[None, :].to(tl.int64)
    d_ok = d < HEAD_DIM
    d4 = tl.arange(0, BLOCK_D // 4)[None, :]
    for n0 in range(n_start, n_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_ok = pos < n_end
        if MASKED:
            blk = tl.load(table_ptr + pos // block_size, mask=pos_ok, other=0).to(tl.int64)
        else:
            blk = tl.load(table_ptr + pos // block_size).to(tl.int64)
        off = (pos % block_size).to(tl.int64)
        if LAYOUT == 1:
            # A page holds K as [D/x, B, x] (one 16-byte row of x dims per position and slab) and V as
            # [B/x, D, x] (one 16-byte run of x positions per dim). Both are loaded in that order, as
            # [D/x, BLOCK_N, x] and [BLOCK_N/x, D, x] tiles: a warp's lanes take consecutive 16-byte rows
            # (whole lines, one copy each), and the permute/reshape to [BLOCK_N, D] is a view of the
            # shared-memory tile that ldmatrix reads as MMA operands directly.
            slab = tl.arange(0, BLOCK_D // X)[:, None, None]
            e = tl.arange(0, X)[None, None, :]
            k_row = kv_offsets(
                blk,
                off,
                kvh,
                0,
                num_kv_heads,
                HEAD_DIM,
                block_size,
                stride_cb,
                stride_cn,
                stride_ch,
                LAYOUT,
                X,
            )[0]
            k3_mask = slab * X + e < HEAD_DIM
            if MASKED:
                k3_mask = k3_mask & pos_ok[None, :, None]
            k3 = tl.load(
                k_cache_ptr + k_row[None, :, None] + slab * (block_size * X) + e, mask=k3_mask, other=0.0
            )
            k = tl.reshape(tl.permute(k3, (1, 0, 2)), (BLOCK_N, BLOCK_D)).to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        else:
            k_off, v_off = kv_offsets(
                blk[:, None],
                off[:, None],
                kvh,
                d,
                num_kv_heads,
                HEAD_DIM,
                block_size,
                stride_cb,
                stride_cn,
                stride_ch,
                LAYOUT,
                X,
            )
            if MASKED:
                k = tl.load(k_cache_ptr + k_off, mask=pos_ok[:, None] & d_ok, other=0.0).to(q.dtype)
            else:
                k = tl.load(k_cache_ptr + k_off, mask=d_ok, other=0.0).to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if SCALE_KIND == 2:
            scale_off = (blk * num_kv_heads + kvh) * block_size + off
            s = s * tl.load(k_scale_ptr + scale_off, mask=pos_ok, other=0.0)[None, :]
        s = s * sm_scale
        if HAS_SOFTCAP:
            s = softcap * _tanh(s / softcap)
        s = s * LOG2E
        if MASKED:
            visible = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                visible = visible & (pos[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        p, alpha, m_new, l_i = _softmax_step(s, m_i, l_i)
        if LAYOUT == 1:
            # Runs start at multiples of X (tile starts are multiples of BLOCK_N, itself one of X, and the
            # window start is rounded down to X), so a tile is BLOCK_N / X whole runs. In the masked steps
            # a run's first position is valid whenever any is (valid positions are a prefix) or points
            # into page 0, so whole-run loads stay in bounds; positions past the end are zeroed.
            run = n0 + tl.arange(0, BLOCK_N // X) * X
            if MASKED:
                run_blk = tl.load(table_ptr + run // block_size, mask=run < n_end, other=0).to(tl.int64)
            else:
                run_blk = tl.load(table_ptr + run // block_size).to(tl.int64)
            # The run's first element: offsets are multiples of X there, as written so the compiler sees it.
            v_run = kv_offsets(
                run_blk,
                run % block_size // X * X,
                kvh,
                0,
                num_kv_heads,
                HEAD_DIM,
                block_size,
                stride_cb,
                stride_cn,
                stride_ch,
                LAYOUT,
                X,
            )[1]
            vd = tl.arange(0, BLOCK_D)[None, :, None]
            v3 = tl.load(v_cache_ptr + v_run[:, None, None] + vd * X + e, mask=vd < HEAD_DIM, other=0.0)
            v = tl.reshape(tl.permute(v3, (0, 2, 1)), (BLOCK_N, BLOCK_D)).to(q.dtype)
            if MASKED:
                v = tl.where(pos_ok[:, None], v, 0.0)
        elif V_WORDS:
            v_row = kv_offsets(
                blk[:, None],
                off[:, None],
                kvh,
                0,
                num_kv_heads,
                HEAD_DIM,
                block_size,
                stride_cb,
                stride_cn,
                stride_ch,
                LAYOUT,
                X,
            )[1]
            v_mask = pos_ok[:, None] & (d4 < HEAD_DIM // 4) if MASKED else d4 < HEAD_DIM // 4
            v = _load_e4m3_rows_as_f16(v_cache_ptr, v_row, v_mask, BLOCK_N, BLOCK_D)
        elif MASKED:
            v = tl.load(v_cache_ptr + v_off, mask=pos_ok[:, None] & d_ok, other=0.0).to(q.dtype)
        else:
            v = tl.load(v_cache_ptr + v_off, mask=d_ok, other=0.0).to(q.dtype)
        if SCALE_KIND == 2:
            p = p * tl.load(v_scale_ptr + scale_off, mask=pos_ok, other=0.0)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    k_scale_ptr,
    v_scale_ptr,
    sinks_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    cu_q_ptr,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    sm_scale,
    softcap,
    window,
    num_q_heads,
    num_kv_heads,
    block_size,
    stride_cb,
    stride_cn,
    stride_ch,
    GROUP: tl.constexpr,
    TOKENS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    LAYOUT: tl.constexpr,
    X: tl.constexpr,
    V_WORDS: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP16_COMPUTE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
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

    head, row_ok, q_pos, t_idx = _tile_rows(tok0, q_start, q_len, kv_len, kvh, GROUP, TOKENS, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    io_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)

    # This tile's KV positions [kv_start, kv_end), this split's share of them, and the part of that
    # share every row sees (no masks needed there).
    first_pos = kv_len - q_len + tok0
    kv_end = kv_len - q_len + tl.minimum(tok0 + TOKENS, q_len)
    kv_start = 0
    if HAS_WINDOW:
        kv_start = tl.maximum(first_pos - window + 1, 0)
        if LAYOUT == 1:  # whole V runs (see _attend); the window mask hides the extra positions
            kv_start = kv_start // X * X
    per_split = tl.cdiv(tl.cdiv(kv_end - kv_start, BLOCK_N), NUM_SPLITS) * BLOCK_N
    n_start = kv_start + split * per_split
    n_end = tl.minimum(n_start + per_split, kv_end)
    if NUM_SPLITS > 1:  # noqa: SIM102 (a compile-time branch: one split has no partials)
        if n_start >= n_end:  # a split past a short sequence's end: an empty share, and no o to write
            part = (t_idx * num_q_heads + head) * NUM_SPLITS + split
            tl.store(part_lse_ptr + part, tl.full((BLOCK_M,), float("-inf"), tl.float32), mask=row_ok)
            return
    q = tl.load(
        q_ptr + t_idx[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=io_mask, other=0.0
    )
    if FP16_COMPUTE:
        q = q.to(tl.float16)  # e4m3 -> fp16 is one packed instruction per two values; -> bf16 is not
    if HAS_WINDOW:
        full_end = n_start
    else:
        full_end = n_start + tl.maximum(tl.minimum(n_end, first_pos + 1) - n_start, 0) // BLOCK_N * BLOCK_N

    if SCALE_KIND == 1:
        sm_scale = sm_scale * tl.load(k_scale_ptr)
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = _attend(
        acc,
        l_i,
        m_i,
        q,
        q_pos,
        k_cache_ptr,
        v_cache_ptr,
        k_scale_ptr,
        v_scale_ptr,
        table_ptr,
        n_start,
        full_end,
        kvh,
        num_kv_heads,
        block_size,
        stride_cb,
        stride_cn,
        stride_ch,
        sm_scale,
        softcap,
        window,
        False,
        LAYOUT,
        X,
        V_WORDS,
        SCALE_KIND,
        HAS_SOFTCAP,
        HAS_WINDOW,
        DOT_PRECISION,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
    )
    acc, l_i, m_i = _attend(
        acc,
        l_i,
        m_i,
        q,
        q_pos,
        k_cache_ptr,
        v_cache_ptr,
        k_scale_ptr,
        v_scale_ptr,
        table_ptr,
        full_end,
        n_end,
        kvh,
        num_kv_heads,
        block_size,
        stride_cb,
        stride_cn,
        stride_ch,
        sm_scale,
        softcap,
        window,
        True,
        LAYOUT,
        X,
        V_WORDS,
        SCALE_KIND,
        HAS_SOFTCAP,
        HAS_WINDOW,
        DOT_PRECISION,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
    )
    if SCALE_KIND == 1:
        acc = acc * tl.load(v_scale_ptr)

    if NUM_SPLITS == 1:
        o = _normalize(acc, l_i, m_i, sinks_ptr, head, row_ok, HAS_SINKS)
        out_off = t_idx[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))  # log2 units
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        part = (t_idx * num_q_heads + head) * NUM_SPLITS + split
        tl.store(part_lse_ptr + part, lse, mask=row_ok)
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + d[None, :], o, mask=io_mask)


@triton.jit
def combine_splits_kernel(
    part_o_ptr,
    part_lse_ptr,
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
    lse = tl.load(part_lse_ptr + base + s, mask=s < NUM_SPLITS, other=float("-inf"))
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
    o = tl.load(part_o_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
    o = tl.where(lse[:, None] > float("-inf"), o, 0.0)
    out = tl.sum(w[:, None] * o, 0) / denom
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@triton.jit
def persistent_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    k_scale_ptr,
    v_scale_ptr,
    sinks_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    cu_ptr,
    per_ptr,
    base_ptr,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    sm_scale,
    softcap,
    batch,
    num_q_heads,
    num_kv_heads,
    block_size,
    stride_cb,
    stride_cn,
    stride_ch,
    GROUP: tl.constexpr,
    LAYOUT: tl.constexpr,
    X: tl.constexpr,
    V_WORDS: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP16_COMPUTE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (p, kv head) decodes its share of the partition (see partition.py): one token per sequence."""
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

    rows = tl.arange(0, BLOCK_M)
    head = kvh * GROUP + rows % GROUP
    row_ok = rows < GROUP
    d = tl.arange(0, BLOCK_D)
    io_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    if SCALE_KIND == 1:
        sm_scale = sm_scale * tl.load(k_scale_ptr)
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
        q = tl.load(
            q_ptr + t_idx * stride_qt + head[:, None] * stride_qh + d[None, :], mask=io_mask, other=0.0
        )
        if FP16_COMPUTE:
            q = q.to(tl.float16)
        q_pos = tl.zeros((BLOCK_M,), dtype=tl.int32) + kv_len - 1
        table_ptr = block_tables_ptr + t_idx * stride_bt
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        acc, l_i, m_i = _attend(
            acc,
            l_i,
            m_i,
            q,
            q_pos,
            k_cache_ptr,
            v_cache_ptr,
            k_scale_ptr,
            v_scale_ptr,
            table_ptr,
            n_start,
            full_end,
            kvh,
            num_kv_heads,
            block_size,
            stride_cb,
            stride_cn,
            stride_ch,
            sm_scale,
            softcap,
            0,
            False,
            LAYOUT,
            X,
            V_WORDS,
            SCALE_KIND,
            HAS_SOFTCAP,
            False,
            DOT_PRECISION,
            HEAD_DIM,
            BLOCK_N,
            BLOCK_D,
        )
        acc, l_i, m_i = _attend(
            acc,
            l_i,
            m_i,
            q,
            q_pos,
            k_cache_ptr,
            v_cache_ptr,
            k_scale_ptr,
            v_scale_ptr,
            table_ptr,
            full_end,
            n_end,
            kvh,
            num_kv_heads,
            block_size,
            stride_cb,
            stride_cn,
            stride_ch,
            sm_scale,
            softcap,
            0,
            True,
            LAYOUT,
            X,
            V_WORDS,
            SCALE_KIND,
            HAS_SOFTCAP,
            False,
            DOT_PRECISION,
            HEAD_DIM,
            BLOCK_N,
            BLOCK_D,
        )
        if SCALE_KIND == 1:
            acc = acc * tl.load(v_scale_ptr)
        whole = (seg_lo == seq_first) & (seg_hi == seq_last)
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        o = acc / l_safe[:, None]
        # A sequence this program holds whole is written out; a share of a split one is a partial.
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * LOG2E
            m_fin = tl.maximum(m_i, sink)
            l_fin = l_i * tl.exp2(m_i - m_fin) + tl.exp2(sink - m_fin)
            o_fin = acc * (tl.exp2(m_i - m_fin) / l_fin)[:, None]
        else:
            o_fin = o
        out_off = t_idx * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + out_off, o_fin.to(out_ptr.dtype.element_ty), mask=io_mask & whole)
        slot = (tl.load(base_ptr + b) + p - seq_first // per).to(tl.int64)
        part = slot * num_q_heads + head
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_ok & (whole == 0))
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + d[None, :], o, mask=io_mask & (whole == 0))
        blk = seg_hi
        b += 1


@triton.jit
def combine_partials_kernel(
    part_o_ptr,
    part_lse_ptr,
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
        lse = tl.load(part_lse_ptr + part, mask=ok, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, 0))
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        o = tl.load(
            part_o_ptr + part[:, None] * HEAD_DIM + d[None, :],
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
