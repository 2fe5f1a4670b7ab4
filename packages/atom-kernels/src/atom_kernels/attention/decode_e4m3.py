"""Decode over an e4m3 KV cache in the flash layout, for NVIDIA sm_89+, written in Gluon (explicit layouts).

Why a kernel of its own: the PV product sums over positions, and a flash page keeps the head dim
contiguous, so an MMA operand of V needs a transpose, which ldmatrix has no 8-bit form of. The generic
tile kernel therefore converts V to fp16 and passes it through shared memory a second time (its ncu profile:
shared memory, not DRAM, is the limit). Here every thread reads from the shared-memory tile exactly the
bytes its MMA fragments need, 8 to 32 contiguous bytes per load, and the transpose is a byte permute in
its registers.

The trick is renumbering. A matrix product does not care how its reduction index (QK: the head dim) or its
output columns (PV: the head dim) are numbered, as long as both sides agree. In an MMA operand a thread holds
head dims 8 apart; numbering the dims by a bit permutation (below) makes a thread's dims adjacent in memory.
The loaded tile is renumbered with reshape/permute, which for these layouts moves no data
(convert_layout(..., assert_trivial=True) checks it at compile time), q is loaded in the same numbering,
and the output is stored through the inverse permutation.

One warp per program (split-KV makes about seven per SM: decode.PROGRAMS_PER_SM), a ring of STAGES K/V
tiles filled by cp.async, GQA-packed rows (query tokens x q-heads of one KV head, at most 16).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from atom_kernels.attention.packs import SCORING_FLAGS
from atom_kernels.gluon_helpers import add2, max2, page_of

# Gluon is young: Triton 3.6 names the CTA barrier thread_barrier (3.7: barrier), and 3.9 renames the
# cp.async copy async_copy_global_to_shared to async_load.
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
_copy_to_shared = getattr(async_copy, "async_load", async_copy.async_copy_global_to_shared)

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
MAX_ROWS = 16  # one MMA row tile: query tokens x q-heads of one KV head
BLOCK_M: gl.constexpr = gl.constexpr(MAX_ROWS)
HEAD_DIMS = (
    64,
    128,
)  # row lengths the swizzle below serves (D=256 would conflict; it keeps the generic kernel)


@gluon.constexpr_function
def mma_layout():
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])


@gluon.constexpr_function
def copy_layout(head_dim):
    """[BLOCK_N, D] bytes, 16 per lane along a row: the cp.async source layout."""
    lanes_d = head_dim // 16
    return gl.BlockedLayout([1, 16], [32 // lanes_d, lanes_d], [1, 1], [1, 0])


@gluon.constexpr_function
def smem_layout(head_dim):
    """XOR-swizzled 16-byte chunks. At D=128 the copies and the K and V reads below are free of bank
    conflicts; at D=64 a V read takes one extra wavefront (its four rows per half warp are all even, and a
    64-byte row's XOR stays in its half of the banks). tests/test_decode_e4m3.py checks both."""
    per_phase = max(1, 128 // head_dim)
    return gl.SwizzledSharedLayout(vec=16, per_phase=per_phase, max_phase=8 // per_phase, order=[1, 0])


@gluon.constexpr_function
def k_read_layout(block_n, head_dim):
    """K tile [BLOCK_N, D] (physical dims) as the QK product's B operand needs it, in renumbered dims.

    A B operand of K^T holds, per thread, reduction indices k0 and k3.. in registers and k1, k2 in lanes.
    Physical dim bits (low to high): k0, k3 .. k_{b-1}, k1, k2 -- so a thread's registers are 2^(b-2)
    contiguous bytes of one position, and lanes step by quarter rows.
    """
    b = head_dim.bit_length() - 1
    regs = [[0, 1 << i] for i in range(b - 2)] + [[1 << i, 0] for i in range(3, block_n.bit_length() - 1)]
    lanes = [[0, 1 << (b - 2)], [0, 1 << (b - 1)], [1, 0], [2, 0], [4, 0]]
    return gl.DistributedLinearLayout(regs, lanes, [], [], [block_n, head_dim])


@gluon.constexpr_function
def v_read_layout(block_n, head_dim):
    """V tile [BLOCK_N, D] (physical dims) as the PV product's B operand needs it, in renumbered dims.

    A B operand of V holds output columns n0..n2 in lanes and n3.. in registers; physical dim bits (low to
    high) n3 .. n_{b-1}, n0, n1, n2 give each thread 2^(b-3) contiguous bytes per position.
    """
    b = head_dim.bit_length() - 1
    regs = (
        [[0, 1 << i] for i in range(b - 3)]
        + [[1, 0]]
        + [[1 << i, 0] for i in range(3, block_n.bit_length() - 1)]
    )
    lanes = [[2, 0], [4, 0], [0, 1 << (b - 3)], [0, 1 << (b - 2)], [0, 1 << (b - 1)]]
    return gl.DistributedLinearLayout(regs, lanes, [], [], [block_n, head_dim])


@gluon.constexpr_function
def v_pair_layout(block_n, head_dim):
    """v_read_layout with its registers reordered (position bit 0, then the dims): each run of four register
    elements is positions p, p + 1 at dims d, d + 1."""
    layout = v_read_layout(block_n, head_dim)
    regs = layout.reg_bases
    pos_bit0 = regs.index([1, 0])
    return gl.DistributedLinearLayout(
        [regs[pos_bit0], *regs[:pos_bit0], *regs[pos_bit0 + 1 :]], layout.lane_bases, [], [], layout.shape
    )


# The kernel's derived constexprs: its tile's query tokens, and the features its scoring pack turns on.
DERIVED_E4M3 = SCORING_FLAGS | {"TOKENS": lambda a: MAX_ROWS // a["GROUP"]}

# cdiv is written out in the kernel for the reason gluon_helpers gives for its reductions.


@gluon.jit
def _k_dim_of(k, HEAD_DIM: gl.constexpr):
    """Physical dim of QK reduction index k (the numbering of k_read_layout)."""
    return ((k >> 1) & 3) * (HEAD_DIM // 4) + (k >> 3) * 2 + (k & 1)


@gluon.jit
def _v_dim_of(n, HEAD_DIM: gl.constexpr):
    """Physical dim of PV output column n (the numbering of v_read_layout)."""
    return (n & 7) * (HEAD_DIM // 8) + (n >> 3)


@gluon.jit
def _e4m3x4_to_f16(x):
    """e4m3 -> fp16 where each run of four register elements is one 32-bit word: two conversions of byte
    pairs, whose fp16 pairs are the MMA's 32-bit operand registers as they stand."""
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r",
        [x.to(gl.int8, bitcast=True)],
        dtype=gl.float16,
        is_pure=True,
        pack=4,
    )


@gluon.jit
def _k_operand(k_tile, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, B_OP: gl.constexpr):
    """[BLOCK_N, D] e4m3 in physical dims -> K^T [D, BLOCK_N] fp16 in QK numbering, as the MMA's B operand.
    A register word holds dims (k0, k3) = four adjacent bytes of one position: converted as loaded."""
    k = _e4m3x4_to_f16(k_tile)
    k = gl.reshape(k, [BLOCK_N, 4, HEAD_DIM // 8, 2])  # dim bits: (k2 k1) (k_{b-1}..k3) (k0)
    k = gl.reshape(gl.permute(k, (0, 2, 1, 3)), [BLOCK_N, HEAD_DIM])
    return gl.convert_layout(gl.permute(k, (1, 0)), B_OP, assert_trivial=True)


@gluon.jit
def _v_operand(v_tile, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, B_OP: gl.constexpr):
    """[BLOCK_N, D] e4m3 in physical dims -> [BLOCK_N, D] fp16 in PV numbering, as the MMA's B operand.
    The MMA pairs two positions of one dim in a register: the bytes of positions p and p + 1 at dims d and
    d + 1 are gathered into one word (a byte permute) and converted to the two fp16 pairs."""
    v = gl.convert_layout(v_tile, v_pair_layout(BLOCK_N, HEAD_DIM), assert_trivial=True)
    v = _e4m3x4_to_f16(v)
    v = gl.reshape(v, [BLOCK_N, 8, HEAD_DIM // 8])  # dim bits: (n2 n1 n0) (n_{b-1}..n3)
    v = gl.reshape(gl.permute(v, (0, 2, 1)), [BLOCK_N, HEAD_DIM])
    return gl.convert_layout(v, B_OP, assert_trivial=True)


@gluon.jit
def _issue_tile(
    k_smem,
    v_smem,
    ks_smem,
    vs_smem,
    kv,
    table_ptr,
    t,
    n_start,
    n_end,
    kvh,
    SCALE_KIND: gl.constexpr,
    PAGE: gl.constexpr,
    STAGES: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    COPY: gl.constexpr,
):
    """Start copying KV tile t (positions n_start + t * BLOCK_N ...) into ring slot t % STAGES, with its
    per-token scales (SCALE_KIND 2): read right after the QK product, a load there would stall it.

    Rows at or past n_end are zero-filled without being read (nor is their block-table entry)."""
    pos = n_start + t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, COPY))
    ok = pos < n_end
    page, off = page_of(pos, kv.block_size, PAGE)
    blk = gl.load(table_ptr + page, mask=ok, other=0).to(gl.int64)
    row = blk * kv.stride_cb + off.to(gl.int64) * kv.stride_cn + kvh * kv.stride_ch
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, COPY))
    off = gl.expand_dims(row, 1) + gl.expand_dims(d, 0)
    mask = gl.expand_dims(ok, 1)
    _copy_to_shared(k_smem.index(t % STAGES), kv.k + off, mask=mask)
    _copy_to_shared(v_smem.index(t % STAGES), kv.v + off, mask=mask)
    if SCALE_KIND == 2:
        LANES: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
        pos = n_start + t * BLOCK_N + gl.arange(0, BLOCK_N, layout=LANES)
        ok = pos < n_end
        page, off = page_of(pos, kv.block_size, PAGE)
        blk = gl.load(table_ptr + page, mask=ok, other=0).to(gl.int64)
        scale_off = (blk * kv.num_kv_heads + kvh) * kv.block_size + off
        _copy_to_shared(ks_smem.index(t % STAGES), kv.k_scale + scale_off, mask=ok)
        _copy_to_shared(vs_smem.index(t % STAGES), kv.v_scale + scale_off, mask=ok)
    async_copy.commit_group()


@triton.heuristics(DERIVED_E4M3)
@gluon.jit
def e4m3_decode_kernel(
    rows,
    kv,
    scores,
    parts,
    seq_lens_ptr,
    cu_q_ptr,
    num_q_heads,
    GROUP: gl.constexpr,
    NUM_SPLITS: gl.constexpr,
    SCALE_KIND: gl.constexpr,
    HAS_SINKS: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    PAGE: gl.constexpr,
    TOKENS: gl.constexpr,
    HAS_SOFTCAP: gl.constexpr,
    HAS_WINDOW: gl.constexpr,
):
    """Grid (tiles x NUM_SPLITS, batch, kv heads), the generic tile kernel's, with its packs (attention/packs.py)
    and partial-output format. The last three constexprs follow from the rest (DERIVED_E4M3)."""
    MMA: gl.constexpr = mma_layout()
    A_OP: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    B_OP: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    COPY: gl.constexpr = copy_layout(HEAD_DIM)
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    COLS: gl.constexpr = gl.SliceLayout(0, MMA)

    pid = gl.program_id(0)
    seq = gl.program_id(1)
    kvh = gl.program_id(2)
    tile = gl.num_programs(0) // NUM_SPLITS - 1 - pid // NUM_SPLITS
    split = pid % NUM_SPLITS
    q_start = gl.load(cu_q_ptr + seq)
    q_len = gl.load(cu_q_ptr + seq + 1) - q_start
    tok0 = tile * TOKENS
    if tok0 >= q_len:
        return
    kv_len = gl.load(seq_lens_ptr + seq)

    # Rows: token tok0 + r // GROUP, q-head kvh * GROUP + r % GROUP (GQA packing), in the MMA's row layout.
    r = gl.arange(0, BLOCK_M, layout=ROWS)
    tok = tok0 + r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = (r < TOKENS * GROUP) & (tok < q_len)
    q_pos = kv_len - q_len + tok
    t_idx = (q_start + tok).to(gl.int64)

    # q in the QK numbering of the head dim, loaded straight into the A operand's layout.
    qr = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, A_OP))
    q_tok = (q_start + tok0 + qr // GROUP).to(gl.int64)
    q_ok = (qr < TOKENS * GROUP) & (tok0 + qr // GROUP < q_len)
    qk = _k_dim_of(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, A_OP)), HEAD_DIM)
    q_off = q_tok * rows.stride_qt + (kvh * GROUP + qr % GROUP) * rows.stride_qh
    q_off = gl.expand_dims(q_off, 1) + gl.expand_dims(qk, 0)
    q = gl.load(rows.q + q_off, mask=gl.expand_dims(q_ok, 1), other=0.0).to(gl.float16)

    # This split's share of the visible positions, as in the generic kernel.
    kv_end = kv_len - q_len + gl.minimum(tok0 + TOKENS, q_len)
    kv_start = 0
    if HAS_WINDOW:
        kv_start = gl.maximum(kv_len - q_len + tok0 - scores.window + 1, 0)
    tiles_seen = (kv_end - kv_start + BLOCK_N - 1) // BLOCK_N
    per_split = (tiles_seen + NUM_SPLITS - 1) // NUM_SPLITS * BLOCK_N
    n_start = kv_start + split * per_split
    n_end = gl.minimum(n_start + per_split, kv_end)
    num_tiles = (gl.maximum(n_end - n_start, 0) + BLOCK_N - 1) // BLOCK_N

    qk_scale = scores.sm_scale
    if SCALE_KIND == 1:
        qk_scale = qk_scale * gl.load(kv.k_scale)
    if not HAS_SOFTCAP:
        qk_scale = qk_scale * LOG2E
    table_ptr = kv.block_tables + seq.to(gl.int64) * kv.stride_bt
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, HEAD_DIM], smem_layout(HEAD_DIM))
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, HEAD_DIM], smem_layout(HEAD_DIM))
    ks_smem = v_smem  # placeholders when there are no per-token scales
    vs_smem = v_smem
    if SCALE_KIND == 2:
        PLAIN: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        ks_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], PLAIN)
        vs_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], PLAIN)
    for t in gl.static_range(STAGES - 1):
        _issue_tile(
            k_smem, v_smem, ks_smem, vs_smem, kv, table_ptr, t, n_start, n_end, kvh,
            SCALE_KIND, PAGE, STAGES, BLOCK_N, HEAD_DIM, COPY,
        )  # fmt: skip

    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, MMA)
    l_i = gl.zeros([BLOCK_M], gl.float32, ROWS)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROWS)
    for i in range(num_tiles):
        async_copy.wait_group(STAGES - 2)  # tile i has landed (this thread's copies) ...
        _cta_barrier()  # ... and every thread's; and nobody still reads the slot refilled next
        _issue_tile(
            k_smem, v_smem, ks_smem, vs_smem, kv, table_ptr, i + STAGES - 1, n_start, n_end, kvh,
            SCALE_KIND, PAGE, STAGES, BLOCK_N, HEAD_DIM, COPY,
        )  # fmt: skip
        slot = i % STAGES
        k = _k_operand(k_smem.index(slot).load(k_read_layout(BLOCK_N, HEAD_DIM)), BLOCK_N, HEAD_DIM, B_OP)
        s = mma_v2(q, k, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA)) * qk_scale

        pos = n_start + i * BLOCK_N + gl.arange(0, BLOCK_N, layout=COLS)
        pos_ok = pos < n_end
        if SCALE_KIND == 2:
            s = s * gl.expand_dims(ks_smem.index(slot).load(COLS), 0)
        if HAS_SOFTCAP:  # softcap * tanh(s / softcap), in log2 units
            s = scores.softcap * LOG2E * (1.0 - 2.0 / (gl.exp(2.0 * s / scores.softcap) + 1.0))
        visible = gl.expand_dims(pos_ok, 0) & (gl.expand_dims(pos, 0) <= gl.expand_dims(q_pos, 1))
        if HAS_WINDOW:
            visible = visible & (gl.expand_dims(pos, 0) > gl.expand_dims(q_pos, 1) - scores.window)
        s = gl.where(visible, s, float("-inf"))

        m_new = gl.maximum(m_i, gl.reduce(s, 1, max2))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = gl.exp2(s - gl.expand_dims(m_safe, 1))
        alpha = gl.exp2(m_i - m_safe)
        l_i = l_i * alpha + gl.reduce(p, 1, add2)
        m_i = m_new
        if SCALE_KIND == 2:
            p = p * gl.expand_dims(vs_smem.index(slot).load(COLS), 0)
        p16 = gl.convert_layout(p.to(gl.float16), A_OP, assert_trivial=True)
        v = _v_operand(v_smem.index(slot).load(v_read_layout(BLOCK_N, HEAD_DIM)), BLOCK_N, HEAD_DIM, B_OP)
        acc = mma_v2(p16, v, acc * gl.expand_dims(alpha, 1))
    async_copy.wait_group(0)  # the ring's trailing (empty) copies
    if SCALE_KIND == 1:
        acc = acc * gl.load(kv.v_scale)

    dims = _v_dim_of(gl.arange(0, HEAD_DIM, layout=COLS), HEAD_DIM)  # acc's columns, as physical dims
    io_mask = gl.expand_dims(row_ok, 1) & (gl.expand_dims(dims, 0) < HEAD_DIM)
    if NUM_SPLITS == 1:
        if HAS_SINKS:
            sink = gl.load(scores.sinks + head, mask=row_ok, other=0.0) * LOG2E
            m_sink = gl.maximum(m_i, sink)
            alpha = gl.exp2(m_i - m_sink)
            l_i = l_i * alpha + gl.exp2(sink - m_sink)
            acc = acc * gl.expand_dims(alpha, 1)
        o = acc / gl.expand_dims(gl.where(l_i > 0, l_i, 1.0), 1)
        out_off = gl.expand_dims(t_idx * rows.stride_ot + head * rows.stride_oh, 1) + gl.expand_dims(dims, 0)
        gl.store(rows.out + out_off, o.to(rows.out.dtype.element_ty), mask=io_mask)
    else:
        lse = gl.where(l_i > 0, m_i + gl.log2(gl.where(l_i > 0, l_i, 1.0)), float("-inf"))  # log2 units
        o = acc / gl.expand_dims(gl.where(l_i > 0, l_i, 1.0), 1)
        part = (t_idx * num_q_heads + head) * NUM_SPLITS + split
        gl.store(parts.lse + part, lse, mask=row_ok)
        gl.store(parts.o + gl.expand_dims(part * HEAD_DIM, 1) + gl.expand_dims(dims, 0), o, mask=io_mask)


def e4m3_decode_supported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether e4m3_decode_kernel takes this call: NVIDIA sm_89+ (e4m3 -> f16 conversions), a flash-layout
    e4m3 cache whose rows start 16-byte aligned (cp.async) with K and V addressed alike, head_dim 64 or
    128, fp16/bf16 q, at most 16 q-heads per KV head."""
    group = q.shape[1] // max(1, k_cache.shape[2]) if k_cache.dim() == 4 else MAX_ROWS + 1
    return (
        q.is_cuda
        and torch.version.hip is None
        and torch.cuda.get_device_capability(q.device) >= (8, 9)
        and k_cache.dtype == v_cache.dtype == torch.float8_e4m3fn
        and q.dtype in (torch.float16, torch.bfloat16)
        and k_cache.dim() == 4
        and k_cache.shape[-1] in HEAD_DIMS
        and k_cache.stride() == v_cache.stride()
        and k_cache.stride(-1) == 1
        and all(s % 16 == 0 for s in k_cache.stride()[:3])
        and k_cache.data_ptr() % 16 == 0
        and v_cache.data_ptr() % 16 == 0
        and group <= MAX_ROWS
    )
