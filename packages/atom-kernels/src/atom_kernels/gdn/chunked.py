"""Chunked prefill of the gated delta rule: three launches, two of them parallel over every chunk.

Per chunk of C=64 tokens and value head (math as transformers' torch_chunk_gated_delta_rule):
1. prepare (all chunks at once): cumulative log decay, the strictly lower system A = (beta k k^T) *
   decay, its inverse T = (I + A)^-1 by halves (each diagonal block's inverse is a short product of
   matmuls since A is nilpotent, then the off-diagonal block), then w = T (beta k exp(cum)) and
   u = T (beta v);
   and, for step 2, the keys decayed to the chunk's end and the chunk's whole decay;
2. state (sequential over a sequence's chunks, parallel over heads and value blocks): the state before
   each chunk, and the chunk's corrected values v_new = u - w S^T; the final state goes to the slot,
   and a snapshot's (the plan ends a chunk where it is taken) to the snapshot's slot;
3. output (all chunks at once): o = (q exp(cum)) S_before^T + ((q k^T) * decay, causal) v_new.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.gdn.call import GdnCall, SequenceSlots, Snapshots
from atom_kernels.gdn.inputs import gdn_entry, padded_head_size, unit_stride
from atom_kernels.gdn.packs import ChunkBuffers, ChunkPlan, state_slots, token_heads
from atom_kernels.settings import SETTINGS, Backend

CHUNK = 64


@dataclass(frozen=True, slots=True)
class GdnTiles:
    """Launch shapes of the chunked kernels. lowp: with 16-bit activations, the state and output kernels'
    matmuls take operands in that dtype (the state and all sums stay fp32), as the intermediates are
    stored in it anyway; inverse_precision is the prepare kernel's (the inverse needs fp32 accuracy)."""

    state_block_v: int = 32
    state_warps: int = 4
    state_stages: int = 3
    out_block_v: int = 64
    out_warps: int = 4
    prepare_warps: int = 4
    lowp: bool = True
    inverse_precision: str = "tf32x3"


def gdn_tiles(dtype: torch.dtype, dv: int, *, interpret: bool = False) -> GdnTiles:
    """Defaults, from benchmarks/sweep_gdn.py; fp32 activations keep 3-pass TF32 everywhere, the
    interpreter and ROCm IEEE fp32."""
    exact = interpret or torch.version.hip is not None
    return GdnTiles(
        state_block_v=min(dv, 32),
        out_block_v=min(dv, 32 if interpret else 64),  # several value blocks on the CPU too
        lowp=dtype != torch.float32 and not interpret,
        # 1-pass TF32 suffices when w and u are stored in 16 bits: sweep_gdn.py found the same error
        # against an fp32 run as with 3-pass, in less prepare time
        inverse_precision="ieee" if exact else "tf32x3" if dtype == torch.float32 else "tf32",
    )


@triton.jit
def _rows_l2(x, L2NORM: tl.constexpr):
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _within(offs, N: tl.constexpr, B: tl.constexpr):
    """offs < N for offsets into a block of B >= N: a constant all-true mask when B == N, so a head that
    needs no padding compiles to the unmasked loads and stores (a compare would cost them vectorization)."""
    return tl.full(offs.shape, 1, tl.int1) if B == N else offs < N


@triton.jit
def _mm(a, b, LOWP: tl.constexpr, LOW: tl.constexpr, PREC: tl.constexpr):
    """a @ b with fp32 sums: operands in the 16-bit dtype LOW when LOWP, else fp32 at PREC."""
    if LOWP:
        out = tl.dot(a.to(LOW), b.to(LOW))
    else:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)
    return out


@triton.jit
def _unit_lower_inverse(a, N: tl.constexpr, LOG2N: tl.constexpr, PREC: tl.constexpr):
    """(I + a)^-1 for a strictly lower [N, N] a: a is nilpotent, so the inverse is the finite product
    (I - a)(I + a^2)(I + a^4)... (a^N = 0)."""
    idx = tl.arange(0, N)
    power = -a
    inv = tl.where(idx[:, None] == idx[None, :], 1.0, 0.0) + power
    for _ in tl.static_range(LOG2N - 1):
        power = tl.dot(power, power, input_precision=PREC)
        inv = inv + tl.dot(inv, power, input_precision=PREC)
    return inv


@triton.jit
def _prepare_kernel(
    k,
    v,
    g_ptr,
    beta_ptr,
    plan,
    bufs,
    num_v_heads,
    group,
    C: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
    LOG2C: tl.constexpr,
    PREC_INV: tl.constexpr,
    LOWP: tl.constexpr,
):
    """Program (chunk, value head): step 1. k, v: packs.TokenHeads; plan: packs.ChunkPlan; bufs:
    packs.ChunkBuffers (cum, w, u, kd and decay written here)."""
    # The chunk in two halves of H = C/2 rows: T = (I + A)^-1 is lower block-triangular, so it is the two
    # diagonal blocks' inverses (independent, half as long) and T10 = -T11 A10 T00.
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    seq = tl.load(plan.chunk_seq + c)
    if seq < 0:  # past the last chunk (the grid is sized from shapes, not from the lengths)
        return
    HALF: tl.constexpr = C // 2
    LOW: tl.constexpr = bufs.w.dtype.element_ty
    t0 = tl.load(plan.chunk_start + c)
    end = tl.load(plan.chunk_end + c)
    r = tl.arange(0, HALF)
    rows0, rows1 = (t0 + r).to(tl.int64), (t0 + HALF + r).to(tl.int64)
    ok0, ok1 = rows0 < end, rows1 < end
    # head sizes padded to BK, BV (powers of two): the padding columns load as zeros, so they add nothing
    # to any product or norm, and the intermediates keep them (zeros) at the padded widths
    ks, vs = tl.arange(0, BK), tl.arange(0, BV)
    kcols, vcols = _within(ks, DK, BK)[None, :], _within(vs, DV, BV)[None, :]
    k_head = k.x + (hv // group) * k.stride_h + ks[None, :]
    k0 = tl.load(k_head + rows0[:, None] * k.stride_t, mask=ok0[:, None] & kcols, other=0.0)
    k0 = _rows_l2(k0.to(tl.float32), L2NORM)
    k1 = tl.load(k_head + rows1[:, None] * k.stride_t, mask=ok1[:, None] & kcols, other=0.0)
    k1 = _rows_l2(k1.to(tl.float32), L2NORM)
    g0 = tl.load(g_ptr + rows0 * num_v_heads + hv, mask=ok0, other=0.0).to(tl.float32)
    g1 = tl.load(g_ptr + rows1 * num_v_heads + hv, mask=ok1, other=0.0).to(tl.float32)
    b0 = tl.load(beta_ptr + rows0 * num_v_heads + hv, mask=ok0, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + rows1 * num_v_heads + hv, mask=ok1, other=0.0).to(tl.float32)
    cum0 = tl.cumsum(g0, axis=0)
    cum1 = tl.cumsum(g1, axis=0) + tl.sum(g0, axis=0)
    slot = c * num_v_heads + hv
    tl.store(bufs.cum + slot * C + r, cum0)
    tl.store(bufs.cum + slot * C + HALF + r, cum1)
    kb0, kb1 = k0 * b0[:, None], k1 * b1[:, None]
    lower = r[:, None] > r[None, :]
    # A = (beta k k^T) * exp(cum_i - cum_j) below the diagonal; every entry of block 10 is below it.
    a00 = _mm(kb0, tl.trans(k0), LOWP, LOW, PREC_INV) * tl.exp(
        tl.where(lower, cum0[:, None] - cum0[None, :], float("-inf"))
    )
    a11 = _mm(kb1, tl.trans(k1), LOWP, LOW, PREC_INV) * tl.exp(
        tl.where(lower, cum1[:, None] - cum1[None, :], float("-inf"))
    )
    a10 = _mm(kb1, tl.trans(k0), LOWP, LOW, PREC_INV) * tl.exp(cum1[:, None] - cum0[None, :])
    t00 = _unit_lower_inverse(a00, HALF, LOG2C - 1, PREC_INV)
    t11 = _unit_lower_inverse(a11, HALF, LOG2C - 1, PREC_INV)
    t10 = -tl.dot(t11, tl.dot(a10, t00, input_precision=PREC_INV), input_precision=PREC_INV)
    # w = T (beta k exp(cum)), u = T (beta v), per half of the rows
    x0, x1 = kb0 * tl.exp(cum0)[:, None], kb1 * tl.exp(cum1)[:, None]
    w0 = _mm(t00, x0, LOWP, LOW, PREC_INV)
    w1 = _mm(t10, x0, LOWP, LOW, PREC_INV) + _mm(t11, x1, LOWP, LOW, PREC_INV)
    w_rows = bufs.w + slot * C * BK + ks[None, :]
    tl.store(w_rows + r[:, None] * BK, w0.to(LOW))
    tl.store(w_rows + (HALF + r)[:, None] * BK, w1.to(LOW))
    v_head = v.x + hv * v.stride_h + vs[None, :]
    v0 = tl.load(v_head + rows0[:, None] * v.stride_t, mask=ok0[:, None] & vcols, other=0.0)
    v0 = v0.to(tl.float32) * b0[:, None]
    v1 = tl.load(v_head + rows1[:, None] * v.stride_t, mask=ok1[:, None] & vcols, other=0.0)
    v1 = v1.to(tl.float32) * b1[:, None]
    u0 = _mm(t00, v0, LOWP, LOW, PREC_INV)
    u1 = _mm(t10, v0, LOWP, LOW, PREC_INV) + _mm(t11, v1, LOWP, LOW, PREC_INV)
    u_rows = bufs.u + slot * C * BV + vs[None, :]
    tl.store(u_rows + r[:, None] * BV, u0.to(LOW))
    tl.store(u_rows + (HALF + r)[:, None] * BV, u1.to(LOW))
    # For the sequential state kernel, done here in parallel: the keys decayed to the chunk's end, and the
    # chunk's whole decay (padding rows have g = 0, so the sum is the decay up to the last real token).
    total = tl.sum(g0, axis=0) + tl.sum(g1, axis=0)
    kd_rows = bufs.kd + slot * C * BK + ks[None, :]
    tl.store(kd_rows + r[:, None] * BK, (k0 * tl.exp(total - cum0)[:, None]).to(LOW))
    tl.store(kd_rows + (HALF + r)[:, None] * BK, (k1 * tl.exp(total - cum1)[:, None]).to(LOW))
    tl.store(bufs.decay + slot, tl.exp(total))


@triton.jit
def _state_kernel(
    plan,
    slots,
    bufs,
    snapshot_slots,
    num_v_heads,
    C: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_SNAPSHOTS: tl.constexpr,
    PREC: tl.constexpr,
    LOWP: tl.constexpr,
):
    """Program (sequence, value head, value block): step 2. slots: packs.StateSlots (h and v_new of bufs
    written here); snapshot_slots [S] (read with HAS_SNAPSHOTS)."""
    # The only sequential part: per chunk two dependent matmuls on the state; every load in the loop
    # depends on the chunk index alone, so the next chunk's can be in flight (num_stages). The state is
    # held transposed, [DK, BLOCK_V], so both matmuls have 64+ rows (Hopper's warpgroup MMA).
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    slot = tl.load(slots.indices + seq).to(tl.int64)
    if slot < 0:
        return
    LOW: tl.constexpr = bufs.w.dtype.element_ty
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    ks = tl.arange(0, BK)
    i = tl.arange(0, C)
    s_ptrs = slots.state + slot * slots.stride_ss + hv * slots.stride_sh + vs[None, :] * DK + ks[:, None]
    real = _within(ks, DK, BK)[:, None] & _within(vs, DV, BV)[None, :]  # the state's own entries
    h = tl.load(s_ptrs, mask=real, other=0.0).to(tl.float32)  # [BK, BLOCK_V]: S^T
    if HAS_INIT:  # a new request starts from zeros, whatever the slot held
        h = tl.where(tl.load(slots.init + seq) != 0, h, 0.0)
    if HAS_SNAPSHOTS:  # the state after chunk snap_c also goes to the snapshot's slot
        snap_slot = tl.load(snapshot_slots + seq).to(tl.int64)
        snap_c = tl.where(snap_slot >= 0, tl.load(plan.snapshot_chunk + seq), -1)
        snap_ptrs = s_ptrs + (snap_slot - slot) * slots.stride_ss
    hv64 = hv.to(tl.int64)  # buffer offsets in int64: chunks * heads * 64 * 128 passes 2^31 at long prompts
    for c in range(tl.load(plan.first_chunk + seq), tl.load(plan.first_chunk + seq + 1)):
        slot_c = c * num_v_heads + hv64
        w = tl.load(bufs.w + slot_c * C * BK + i[:, None] * BK + ks[None, :])
        u = tl.load(bufs.u + slot_c * C * BV + i[:, None] * BV + vs[None, :]).to(tl.float32)
        kd = tl.load(bufs.kd + slot_c * C * BK + i[:, None] * BK + ks[None, :])
        decay = tl.load(bufs.decay + slot_c)
        h_low = h.to(bufs.h.dtype.element_ty)
        tl.store(bufs.h + slot_c * BK * BV + ks[:, None] * BV + vs[None, :], h_low)
        v_new = u - _mm(w, h_low, LOWP, LOW, PREC)  # [C, BLOCK_V]
        v_low = v_new.to(bufs.v_new.dtype.element_ty)
        h = h * decay + _mm(tl.trans(kd), v_low, LOWP, LOW, PREC)
        tl.store(bufs.v_new + slot_c * C * BV + i[:, None] * BV + vs[None, :], v_low)
        if HAS_SNAPSHOTS:
            tl.store(snap_ptrs, h.to(slots.state.dtype.element_ty), mask=real & (c == snap_c))
    tl.store(s_ptrs, h.to(slots.state.dtype.element_ty), mask=real)


@triton.jit
def _output_kernel(
    q,
    k,
    out,
    plan,
    bufs,
    idx_ptr,
    num_v_heads,
    group,
    scale,
    C: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BLOCK_V: tl.constexpr,
    L2NORM: tl.constexpr,
    PREC: tl.constexpr,
    LOWP: tl.constexpr,
):
    """Program (chunk, value head, value block): step 3. q, k, out: packs.TokenHeads; idx: state slots [S]."""
    c = tl.program_id(0).to(tl.int64)
    seq = tl.load(plan.chunk_seq + c)
    if seq < 0:
        return
    hv = tl.program_id(1)
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    t0 = tl.load(plan.chunk_start + c)
    end = tl.load(plan.chunk_end + c)
    i = tl.arange(0, C)
    ks = tl.arange(0, BK)
    kcols = _within(ks, DK, BK)[None, :]
    rows = (t0 + i).to(tl.int64)
    ok = t0 + i < end
    o_ptrs = out.x + rows[:, None] * out.stride_t + hv * out.stride_h + vs[None, :]
    o_mask = ok[:, None] & _within(vs, DV, BV)[None, :]
    if tl.load(idx_ptr + seq) < 0:  # padding sequence: zeros
        tl.store(o_ptrs, tl.zeros([C, BLOCK_V], tl.float32).to(out.x.dtype.element_ty), mask=o_mask)
        return
    LOW: tl.constexpr = bufs.h.dtype.element_ty
    hk = hv // group
    qk_mask = ok[:, None] & kcols
    qc = tl.load(q.x + rows[:, None] * q.stride_t + hk * q.stride_h + ks[None, :], mask=qk_mask, other=0.0)
    qc = _rows_l2(qc.to(tl.float32), L2NORM) * scale
    kc = tl.load(k.x + rows[:, None] * k.stride_t + hk * k.stride_h + ks[None, :], mask=qk_mask, other=0.0)
    kc = _rows_l2(kc.to(tl.float32), L2NORM)
    slot_c = c * num_v_heads + hv
    cum = tl.load(bufs.cum + slot_c * C + i)
    h = tl.load(
        bufs.h + slot_c * BK * BV + ks[:, None] * BV + vs[None, :]
    )  # [BK, BLOCK_V]: S^T before the chunk
    v_new = tl.load(bufs.v_new + slot_c * C * BV + i[:, None] * BV + vs[None, :])
    causal = i[:, None] >= i[None, :]
    decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], float("-inf")))
    o = _mm(qc * tl.exp(cum)[:, None], h, LOWP, LOW, PREC)
    attn = _mm(qc, tl.trans(kc), LOWP, LOW, PREC) * decay
    o += _mm(attn, v_new, LOWP, LOW, PREC)
    tl.store(o_ptrs, o.to(out.x.dtype.element_ty), mask=o_mask)


def max_chunks(tokens: int, seqs: int, *, snapshots: bool = False) -> int:
    """The bound on the chunks of T tokens in S sequences the grids take: each sequence adds at most one
    partial chunk, and one more where a snapshot ends a chunk early."""
    return tokens // CHUNK + seqs * (2 if snapshots else 1)


def plan_chunks(
    cu_seqlens: torch.Tensor, tokens: int, snapshot_lens: torch.Tensor | None = None
) -> ChunkPlan:
    """The chunked kernels' plan for sequences back to back (cu_seqlens [S+1] int, T = tokens), made on
    the device without a host sync: each chunk's sequence (-1 past the last chunk), first and end token,
    and each sequence's first chunk [S+1]. The grid takes max_chunks() programs; the extra ones return
    at once.

    snapshot_lens [S] int (Snapshots.lens): a sequence's chunks end after its first lens[s] tokens too,
    the next starting there, and the plan names that chunk (snapshot_chunk; -1 where lens[s] is not in
    1..length). Without them snapshot_chunk is all -1.

    It depends on cu_seqlens, T and the lens alone, so an engine makes it once a forward and passes it
    to every GDN layer's gated_delta_rule_chunked (plan=), which otherwise makes its own."""
    cu_seqlens = unit_stride(cu_seqlens)[0]
    seqs = cu_seqlens.numel() - 1
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    # each sequence in two pieces, [0, split) and [split, length): the second is empty without a snapshot
    split = lengths
    if snapshot_lens is not None:
        lens = snapshot_lens.long()
        taken = (lens >= 1) & (lens <= lengths)
        split = torch.where(taken, lens, lengths)
    head = (split + CHUNK - 1) // CHUNK
    counts = head + (lengths - split + CHUNK - 1) // CHUNK
    first = torch.zeros(seqs + 1, dtype=torch.long, device=cu.device)
    torch.cumsum(counts, 0, out=first[1:])
    j = torch.arange(max_chunks(tokens, seqs, snapshots=snapshot_lens is not None), device=cu.device)
    seq = torch.searchsorted(first[1:], j, right=True)  # the s with first[s] <= j < first[s + 1]
    inside = seq.clamp(max=seqs - 1)
    local, head_of, split_of = j - first[inside], head[inside], split[inside]
    in_head = local < head_of
    start = torch.where(in_head, local * CHUNK, split_of + (local - head_of) * CHUNK)
    end = torch.minimum(start + CHUNK, torch.where(in_head, split_of, lengths[inside]))
    chunk_seq = torch.where(j < first[-1], seq, -1)
    if snapshot_lens is None:
        snapshot_chunk = torch.full((seqs,), -1, dtype=torch.int32, device=cu.device)
    else:
        snapshot_chunk = torch.where(taken, first[:-1] + head - 1, -1).int()
    base = cu[inside]
    return ChunkPlan(chunk_seq.int(), (base + start).int(), (base + end).int(), first.int(), snapshot_chunk)


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    *,
    has_initial_state: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
    tiles: GdnTiles | None = None,
    plan: ChunkPlan | None = None,
    snapshots: Snapshots | None = None,
) -> torch.Tensor:
    """Chunked gated delta rule for prefill; same arguments and result as `gated_delta_rule_recurrent`.

    Plans the chunks on the device (no host sync; intermediates are sized from T and S). Prefill only:
    decode uses the recurrent kernel.
    tiles: launch shapes and matmul precisions (default `gdn_tiles`).
    plan: `plan_chunks(cu_seqlens, T, snapshots.lens)` when the caller has it (it is the same for every
    layer of a forward); default: made here.
    snapshots: states kept partway through sequences, in slots of their own (call.Snapshots).
    """
    slots = SequenceSlots(cu_seqlens, state_indices, has_initial_state, snapshots=snapshots)
    call = GdnCall(q, k, v, g, beta, state, slots, use_qk_l2norm)
    out, done = gdn_entry(call, out=out, backend=backend)
    if done:
        return out
    cu_seqlens, state_indices, has_initial_state = unit_stride(cu_seqlens, state_indices, has_initial_state)
    tokens, seqs = q.shape[0], state_indices.numel()
    if tokens == 0:
        return out
    chunks = max_chunks(tokens, seqs, snapshots=snapshots is not None)
    num_v_heads, dv, dk = v.shape[1], v.shape[2], q.shape[2]
    bk, bv = padded_head_size(dk), padded_head_size(dv)
    group = num_v_heads // q.shape[1]
    tiles = tiles or gdn_tiles(v.dtype, bv, interpret=SETTINGS.triton_interpret)
    if bv % tiles.state_block_v or bv % tiles.out_block_v:
        raise ValueError(
            f"value blocks {tiles.state_block_v}, {tiles.out_block_v} must divide Dv={dv} padded to {bv}"
        )
    if tiles.state_stages < 2:
        # Triton 3.6 on Hopper: the unpipelined state loop intermittently faults (illegal address) at 8k
        # tokens, while compute-sanitizer finds no bad access or race; 2-4 stages never did.
        raise ValueError(f"state_stages must be >= 2, got {tiles.state_stages}")
    # fp32 activations take 3-pass TF32 on NVIDIA tensor cores (plain fp32 dots of these tiles spill);
    # the interpreter and ROCm IEEE fp32. 16-bit activations with lowp=False take TF32.
    exact = SETTINGS.triton_interpret or torch.version.hip is not None
    prec = "ieee" if exact else "tf32x3" if v.dtype == torch.float32 else "tf32"
    lowp = tiles.lowp and v.dtype != torch.float32
    buf = dict(dtype=v.dtype, device=v.device)  # intermediates in the activations' dtype halve their traffic
    bufs = ChunkBuffers(
        cum=torch.empty(chunks, num_v_heads, CHUNK, dtype=torch.float32, device=v.device),
        # (at the padded head sizes: the kernels write every entry, the padding as zeros)
        w=torch.empty(chunks, num_v_heads, CHUNK, bk, **buf),
        u=torch.empty(chunks, num_v_heads, CHUNK, bv, **buf),
        kd=torch.empty(chunks, num_v_heads, CHUNK, bk, **buf),
        decay=torch.empty(chunks, num_v_heads, dtype=torch.float32, device=v.device),
        h=torch.empty(chunks, num_v_heads, bk, bv, **buf),  # the state before each chunk, transposed
        v_new=torch.empty(chunks, num_v_heads, CHUNK, bv, **buf),
    )
    lens = None if snapshots is None else snapshots.lens
    if plan is None:
        plan = plan_chunks(cu_seqlens, tokens, lens)
    elif plan.chunk_seq.shape != (chunks,) or plan.first_chunk.shape != (seqs + 1,):
        need = f"plan_chunks(cu_seqlens, {tokens}{'' if lens is None else ', snapshots.lens'})"
        raise ValueError(
            f"plan is for {plan.chunk_seq.numel()} chunks and {plan.first_chunk.numel() - 1} sequences; "
            f"these {tokens} tokens in {seqs} sequences need {need}"
        )
    heads = dict(C=CHUNK, DK=dk, DV=dv, BK=bk, BV=bv)
    q_rows, k_rows = token_heads(q), token_heads(k)
    _prepare_kernel[(chunks, num_v_heads)](
        k_rows, token_heads(v), g, beta, plan, bufs, num_v_heads, group, **heads, L2NORM=use_qk_l2norm,
        LOG2C=CHUNK.bit_length() - 1, PREC_INV=tiles.inverse_precision, LOWP=lowp, num_warps=tiles.prepare_warps,
    )  # fmt: skip
    snapshot_slots = state_indices if snapshots is None else unit_stride(snapshots.slots)[0]
    _state_kernel[(seqs, num_v_heads, bv // tiles.state_block_v)](
        plan, state_slots(state, state_indices, has_initial_state), bufs, snapshot_slots, num_v_heads, **heads,
        BLOCK_V=tiles.state_block_v, HAS_INIT=has_initial_state is not None, HAS_SNAPSHOTS=snapshots is not None,
        PREC=prec, LOWP=lowp,
        num_warps=tiles.state_warps, num_stages=tiles.state_stages,
    )  # fmt: skip
    _output_kernel[(chunks, num_v_heads, bv // tiles.out_block_v)](
        q_rows, k_rows, token_heads(out), plan, bufs, state_indices, num_v_heads, group, dk**-0.5, **heads,
        BLOCK_V=tiles.out_block_v, L2NORM=use_qk_l2norm, PREC=prec, LOWP=lowp, num_warps=tiles.out_warps,
    )  # fmt: skip
    return out
