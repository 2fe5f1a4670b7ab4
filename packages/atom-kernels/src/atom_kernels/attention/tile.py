"""Device helpers of the paged-attention tile kernels (tile_kernel.py, persistent_kernel.py, prefill_tma.py).

A tile is up to TOKENS query tokens of one sequence times the GROUP q-heads that share one KV head
(GQA packing: rows r -> token r // GROUP, head r % GROUP), so K/V are read once for the whole group.
`attend` walks a range of KV positions through the block table (any page size): ranges every row can
see run without masks (MASKED False), the causal edge and sliding window with them.
"""

import triton
import triton.language as tl

from atom_kernels.cache.offsets import kv_offsets

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def load_e4m3_rows_as_f16(base_ptr, row_off, mask, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
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
def tile_rows(
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
def softmax_step(s, m_i, l_i):
    """Online softmax over one block of log2-scaled scores s: -> (p, rescale of the running sums, m, l)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def normalize(acc, l_i, m_i, sinks_ptr, head, row_ok, HAS_SINKS: tl.constexpr):
    """The finished rows' output acc / l, with each q-head's sink logit joining the denominator."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * LOG2E
        m_new = tl.maximum(m_i, sink)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.exp2(sink - m_new)
        acc = acc * alpha[:, None]
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit
def kv_rows(kv, blk, off, kvh, d, HEAD_DIM: tl.constexpr, FMT: tl.constexpr):
    """kv_offsets of the pack's cache: (K, V) element offsets of positions (blk, off), head kvh, dims d."""
    return kv_offsets(
        blk, off, kvh, d, kv.num_kv_heads, HEAD_DIM, kv.block_size, kv.stride_cb, kv.stride_cn, kv.stride_ch,
        FMT.LAYOUT, FMT.X,
    )  # fmt: skip


@triton.jit
def attend(
    acc,
    l_i,
    m_i,
    q,
    q_pos,
    kv,
    table_ptr,
    n_start,
    n_end,
    kvh,
    scores,
    FMT: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Fold KV positions [n_start, n_end) of one sequence (table_ptr: its block-table row) into the online
    softmax state (acc [BLOCK_M, BLOCK_D], l_i, m_i) of rows q at absolute positions q_pos."""
    d = tl.arange(0, BLOCK_D)[None, :].to(tl.int64)
    d_ok = d < HEAD_DIM
    d4 = tl.arange(0, BLOCK_D // 4)[None, :]
    sm_scale = scores.sm_scale
    if FMT.SCALE_KIND == 1:
        sm_scale = sm_scale * tl.load(kv.k_scale)
    for n0 in range(n_start, n_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_ok = pos < n_end
        if MASKED:
            blk = tl.load(table_ptr + pos // kv.block_size, mask=pos_ok, other=0).to(tl.int64)
        else:
            blk = tl.load(table_ptr + pos // kv.block_size).to(tl.int64)
        off = (pos % kv.block_size).to(tl.int64)
        if FMT.LAYOUT == 1:
            # A page holds K as [D/x, B, x] (one 16-byte row of x dims per position and slab) and V as
            # [B/x, D, x] (one 16-byte run of x positions per dim). Both are loaded in that order, as
            # [D/x, BLOCK_N, x] and [BLOCK_N/x, D, x] tiles: a warp's lanes take consecutive 16-byte rows
            # (whole lines, one copy each), and the permute/reshape to [BLOCK_N, D] is a view of the
            # shared-memory tile that ldmatrix reads as MMA operands directly.
            slab = tl.arange(0, BLOCK_D // FMT.X)[:, None, None]
            e = tl.arange(0, FMT.X)[None, None, :]
            k_row = kv_rows(kv, blk, off, kvh, 0, HEAD_DIM, FMT)[0]
            k3_mask = slab * FMT.X + e < HEAD_DIM
            if MASKED:
                k3_mask = k3_mask & pos_ok[None, :, None]
            k3 = tl.load(
                kv.k + k_row[None, :, None] + slab * (kv.block_size * FMT.X) + e, mask=k3_mask, other=0.0
            )
            k = tl.reshape(tl.permute(k3, (1, 0, 2)), (BLOCK_N, BLOCK_D)).to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        else:
            k_off, v_off = kv_rows(kv, blk[:, None], off[:, None], kvh, d, HEAD_DIM, FMT)
            if MASKED:
                k = tl.load(kv.k + k_off, mask=pos_ok[:, None] & d_ok, other=0.0).to(q.dtype)
            else:
                k = tl.load(kv.k + k_off, mask=d_ok, other=0.0).to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if FMT.SCALE_KIND == 2:
            scale_off = (blk * kv.num_kv_heads + kvh) * kv.block_size + off
            s = s * tl.load(kv.k_scale + scale_off, mask=pos_ok, other=0.0)[None, :]
        s = s * sm_scale
        if HAS_SOFTCAP:
            s = scores.softcap * tanh(s / scores.softcap)
        s = s * LOG2E
        if MASKED:
            visible = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                visible = visible & (pos[None, :] > q_pos[:, None] - scores.window)
            s = tl.where(visible, s, float("-inf"))
        p, alpha, m_new, l_i = softmax_step(s, m_i, l_i)
        if FMT.LAYOUT == 1:
            # Runs start at multiples of X (tile starts are multiples of BLOCK_N, itself one of X, and the
            # window start is rounded down to X), so a tile is BLOCK_N / X whole runs. In the masked steps
            # a run's first position is valid whenever any is (valid positions are a prefix) or points
            # into page 0, so whole-run loads stay in bounds; positions past the end are zeroed.
            run = n0 + tl.arange(0, BLOCK_N // FMT.X) * FMT.X
            if MASKED:
                run_blk = tl.load(table_ptr + run // kv.block_size, mask=run < n_end, other=0).to(tl.int64)
            else:
                run_blk = tl.load(table_ptr + run // kv.block_size).to(tl.int64)
            # The run's first element: offsets are multiples of X there, as written so the compiler sees it.
            v_run = kv_rows(kv, run_blk, run % kv.block_size // FMT.X * FMT.X, kvh, 0, HEAD_DIM, FMT)[1]
            vd = tl.arange(0, BLOCK_D)[None, :, None]
            v3 = tl.load(kv.v + v_run[:, None, None] + vd * FMT.X + e, mask=vd < HEAD_DIM, other=0.0)
            v = tl.reshape(tl.permute(v3, (0, 2, 1)), (BLOCK_N, BLOCK_D)).to(q.dtype)
            if MASKED:
                v = tl.where(pos_ok[:, None], v, 0.0)
        elif FMT.V_WORDS:
            v_row = kv_rows(kv, blk[:, None], off[:, None], kvh, 0, HEAD_DIM, FMT)[1]
            v_mask = pos_ok[:, None] & (d4 < HEAD_DIM // 4) if MASKED else d4 < HEAD_DIM // 4
            v = load_e4m3_rows_as_f16(kv.v, v_row, v_mask, BLOCK_N, BLOCK_D)
        elif MASKED:
            v = tl.load(kv.v + v_off, mask=pos_ok[:, None] & d_ok, other=0.0).to(q.dtype)
        else:
            v = tl.load(kv.v + v_off, mask=d_ok, other=0.0).to(q.dtype)
        if FMT.SCALE_KIND == 2:
            p = p * tl.load(kv.v_scale + scale_off, mask=pos_ok, other=0.0)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attend_span(
    q, q_pos, kv, table_ptr, n_start, full_end, n_end, kvh, scores,
    FMT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """(acc, l, m) of rows q over KV positions [n_start, n_end): [n_start, full_end) is what every row sees
    without masks, then the causal edge and window with them; a per-tensor V scale is applied to acc."""
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = attend(
        acc, l_i, m_i, q, q_pos, kv, table_ptr, n_start, full_end, kvh, scores,
        FMT, False, HAS_SOFTCAP, HAS_WINDOW, DOT_PRECISION, HEAD_DIM, BLOCK_N, BLOCK_D,
    )  # fmt: skip
    acc, l_i, m_i = attend(
        acc, l_i, m_i, q, q_pos, kv, table_ptr, full_end, n_end, kvh, scores,
        FMT, True, HAS_SOFTCAP, HAS_WINDOW, DOT_PRECISION, HEAD_DIM, BLOCK_N, BLOCK_D,
    )  # fmt: skip
    if FMT.SCALE_KIND == 1:
        acc = acc * tl.load(kv.v_scale)
    return acc, l_i, m_i
