"""Paged prefill on Hopper and newer: K/V tiles fetched whole by the tensor-memory accelerator (TMA).

The generic tile kernel (tile_kernel.py) gathers each KV position through the block table and computes a
64-bit address per element; at prefill's matmul rate those address computations and loads are the
bottleneck. When a page holds a whole number of KV tiles, a tile is BLOCK_N consecutive rows of one page,
so a flash cache viewed as [pages x page rows, row elements] is a 2-D tensor a TMA descriptor can copy a
[BLOCK_N, D] box of straight into shared memory: one block-table lookup per tile and no address math.
Everything else (GQA packing, causal split into unmasked and masked steps, window, soft-cap, sinks)
follows the generic kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.launch import Checked, TileConfig
from atom_kernels.attention.packs import DERIVED_TMA, query_rows, scoring
from atom_kernels.attention.tile import LOG2E, normalize, softmax_step, tanh, tile_rows
from atom_kernels.cache.layout import KVLayout


@triton.jit
def _attend_tma(
    acc,
    l_i,
    m_i,
    q,
    q_pos,
    k_desc,
    v_desc,
    table_ptr,
    n_start,
    n_end,
    kv_len,
    col,
    block_size,
    scores,
    MASKED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    for n0 in range(n_start, n_end, BLOCK_N):
        row = tl.load(table_ptr + n0 // block_size) * block_size + n0 % block_size
        k = k_desc.load([row, col])
        s = tl.dot(q, tl.trans(k)) * scores.sm_scale
        if HAS_SOFTCAP:
            s = scores.softcap * tanh(s / scores.softcap)
        s = s * LOG2E
        pos = n0 + tl.arange(0, BLOCK_N)
        if MASKED:
            visible = (pos[None, :] < n_end) & (pos[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                visible = visible & (pos[None, :] > q_pos[:, None] - scores.window)
            s = tl.where(visible, s, float("-inf"))
        p, alpha, m_new, l_i = softmax_step(s, m_i, l_i)
        v = v_desc.load([row, col])
        if MASKED:  # rows past the sequence's end hold stale or unwritten values (NaN times p = 0 is NaN)
            v = tl.where((pos < kv_len)[:, None], v, 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.heuristics(DERIVED_TMA)
@triton.jit
def paged_prefill_tma_kernel(
    rows,
    k_desc,
    v_desc,
    scores,
    block_tables_ptr,
    seq_lens_ptr,
    cu_q_ptr,
    stride_bt,
    stride_ch,
    block_size,
    GROUP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TOKENS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
):
    """rows: packs.QueryRows; k_desc, v_desc: the caches' TMA descriptors (_descriptor); scores:
    packs.Scoring. The last three constexprs follow from the rest (packs.DERIVED_TMA)."""
    tile = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (causal) tiles first
    seq = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    tok0 = tile * TOKENS
    if tok0 >= q_len:
        return
    kv_len = tl.load(seq_lens_ptr + seq)

    head, row_ok, q_pos, t_idx = tile_rows(tok0, q_start, q_len, kv_len, kvh, GROUP, TOKENS, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    io_mask = row_ok[:, None]
    q_off = t_idx[:, None] * rows.stride_qt + head[:, None] * rows.stride_qh + d[None, :]
    q = tl.load(rows.q + q_off, mask=io_mask, other=0.0)

    first_pos = kv_len - q_len + tok0
    kv_end = kv_len - q_len + tl.minimum(tok0 + TOKENS, q_len)
    kv_start = 0
    if HAS_WINDOW:  # whole tiles from a multiple of BLOCK_N: a TMA box must not straddle two pages
        kv_start = tl.maximum(first_pos - scores.window + 1, 0) // BLOCK_N * BLOCK_N
        full_end = kv_start
    else:
        full_end = tl.minimum(kv_end, first_pos + 1) // BLOCK_N * BLOCK_N
    col = kvh * stride_ch
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = _attend_tma(
        acc, l_i, m_i, q, q_pos, k_desc, v_desc, table_ptr, kv_start, full_end, kv_len, col, block_size,
        scores, False, HAS_SOFTCAP, HAS_WINDOW, BLOCK_N,
    )  # fmt: skip
    acc, l_i, m_i = _attend_tma(
        acc, l_i, m_i, q, q_pos, k_desc, v_desc, table_ptr, full_end, kv_end, kv_len, col, block_size,
        scores, True, HAS_SOFTCAP, HAS_WINDOW, BLOCK_N,
    )  # fmt: skip
    o = normalize(acc, l_i, m_i, scores.sinks, head, row_ok, HAS_SINKS)
    out_off = t_idx[:, None] * rows.stride_ot + head[:, None] * rows.stride_oh + d[None, :]
    tl.store(rows.out + out_off, o.to(rows.out.dtype.element_ty), mask=io_mask)


def tma_prefill_fits(call: PagedCall, c: Checked, block_n: int) -> bool:
    """Whether paged_prefill can take the TMA kernel: an NVIDIA GPU of compute capability 9+, a 16-bit flash
    cache of q's dtype whose pages are contiguous runs of 16-byte-aligned token rows, whole tiles per page,
    and a power-of-two head_dim of 16-256."""
    q = call.q
    if not (q.is_cuda and torch.version.hip is None and torch.cuda.get_device_capability(q.device)[0] >= 9):
        return False
    return tma_layout_fits(call.k_cache, call.v_cache, c, block_n) and call.k_cache.dtype == q.dtype


def tma_layout_fits(k_cache: torch.Tensor, v_cache: torch.Tensor, c: Checked, block_n: int) -> bool:
    """The device-independent part of tma_prefill_fits."""
    if c.layout is not KVLayout.FLASH or c.scale_kind or k_cache.dtype not in (torch.float16, torch.bfloat16):
        return False
    d = c.head_dim
    if d & (d - 1) or not 16 <= d <= 256 or c.block_size % block_n:
        return False
    size = k_cache.element_size()
    for cache in (k_cache, v_cache):
        block, token, _, dim = cache.stride()
        if dim != 1 or block != c.block_size * token or (token * size) % 16 or cache.data_ptr() % 16:
            return False
    return k_cache.stride() == v_cache.stride()


def _descriptor(cache: torch.Tensor, c: Checked, block_n: int) -> TensorDescriptor:
    """The cache as [pages x page rows, row elements]: a [block_n, D] box at (page row, head * head stride)."""
    token, head = cache.stride(1), cache.stride(2)
    cols = (c.num_kv_heads - 1) * head + c.head_dim
    return TensorDescriptor(cache, [c.num_blocks * c.block_size, cols], [token, 1], [block_n, c.head_dim])


def run_tma_prefill(call: PagedCall, c: Checked, *, max_query_len: int, config: TileConfig) -> torch.Tensor:
    """Launch paged_prefill_tma_kernel on a call check_inputs validated and tma_layout_fits accepted."""
    q, k_cache, v_cache, seq_lens = call.q, call.k_cache, call.v_cache, call.seq_lens
    out = c.out
    tokens, num_q_heads, _ = q.shape
    batch = seq_lens.numel()
    if tokens == 0 or batch == 0:
        return out
    group = num_q_heads // c.num_kv_heads
    block_m = max(config.block_m, triton.next_power_of_2(group))
    grid = (triton.cdiv(max_query_len, block_m // group), batch, c.num_kv_heads)
    paged_prefill_tma_kernel[grid](
        query_rows(q, out), _descriptor(k_cache, c, config.block_n), _descriptor(v_cache, c, config.block_n),
        scoring(c.softmax_scale, call.softcap, call.sliding_window, call.sinks, q), call.block_tables,
        seq_lens, call.cu_seqlens_q, call.block_tables.stride(0), k_cache.stride(2), c.block_size,
        GROUP=group, HAS_SINKS=call.sinks is not None, HEAD_DIM=c.head_dim, BLOCK_M=block_m,
        BLOCK_N=config.block_n, num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out
