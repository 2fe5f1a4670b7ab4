"""The gated delta rule token by token over request state slots: decode (one token per sequence),
speculative verify (a few) and short prefills. One program per (sequence, value head, value block)
keeps its [BLOCK_V, Dk] slice of the state in registers for the whole sequence."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.gdn.call import Gating, GdnCall, SequenceSlots
from atom_kernels.gdn.gating import check_gating, gate_values
from atom_kernels.gdn.inputs import gdn_entry, padded_head_size, unit_stride
from atom_kernels.gdn.packs import gating_ptrs, state_slots, token_heads
from atom_kernels.gdn.ref import gdn_gating_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import SETTINGS, Backend, resolve_backend


@triton.jit
def _l2norm(x, L2NORM: tl.constexpr):
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)
    return x


@triton.jit
def _recurrent_kernel(
    q,
    k,
    v,
    out,
    g_ptr,
    beta_ptr,
    gating,  # packs.GatingPtrs: with FUSED_GATING, g and beta come from these
    slots,
    cu_ptr,
    step_ptr,
    num_v_heads,
    group,
    scale,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BLOCK_V: tl.constexpr,
    L2NORM: tl.constexpr,
    HAS_INIT: tl.constexpr,
    STEP_STATES: tl.constexpr,
    FUSED_GATING: tl.constexpr,
    PDL: tl.constexpr,
):
    """q, k, v, out: packs.TokenHeads; slots: packs.StateSlots; g, beta [T, HV] (or, FUSED_GATING, the
    gating's inputs); cu [S+1]; step [T]."""
    let_next_launch(PDL)
    # Nothing before the wait: the states, the slots and the sequences' bounds are all written inside a
    # step (a verify's rollback, the inputs' copies), so the kernel only gets placed early.
    wait_for_inputs(PDL)
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // group
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    ks = tl.arange(0, BK)  # the key head padded to a power of two: the padding loads as zeros
    kcols, vrows = ks < DK, vs < DV
    real = vrows[:, None] & kcols[None, :]  # the state's own entries
    start = tl.load(cu_ptr + seq)
    end = tl.load(cu_ptr + seq + 1)
    slot = tl.load(slots.indices + seq).to(tl.int64)
    start64 = start.to(tl.int64)
    if slot < 0:  # padding: its outputs are zeros, no state is read or written
        for t in range(start, end):
            tl.store(
                out.x + (start64 + (t - start)) * out.stride_t + hv * out.stride_h + vs,
                tl.zeros([BLOCK_V], tl.float32).to(out.x.dtype.element_ty),
                mask=vrows,
            )
        return
    s_row = hv * slots.stride_sh + vs[:, None] * DK + ks[None, :]  # [BLOCK_V, DK] of a slot
    s_ptrs = slots.state + slot * slots.stride_ss + s_row
    h = tl.load(s_ptrs, mask=real, other=0.0).to(tl.float32)
    if HAS_INIT:  # a new request starts from zeros, whatever the slot held
        h = tl.where(tl.load(slots.init + seq) != 0, h, 0.0)
    for t in range(start, end):
        t64 = start64 + (t - start)
        qt = tl.load(q.x + t64 * q.stride_t + hk * q.stride_h + ks, mask=kcols, other=0.0)
        qt = _l2norm(qt.to(tl.float32), L2NORM) * scale
        kt = tl.load(k.x + t64 * k.stride_t + hk * k.stride_h + ks, mask=kcols, other=0.0)
        kt = _l2norm(kt.to(tl.float32), L2NORM)
        vt = tl.load(v.x + t64 * v.stride_t + hv * v.stride_h + vs, mask=vrows, other=0.0).to(tl.float32)
        if FUSED_GATING:
            g, beta = gate_values(
                gating.a_log,
                gating.a,
                gating.dt_bias,
                gating.b,
                t64,
                hv,
                hv >= 0,  # (every head: a scalar mask)
                gating.stride_a,
                gating.stride_b,
            )
        else:
            g = tl.load(g_ptr + t64 * num_v_heads + hv)
            beta = tl.load(beta_ptr + t64 * num_v_heads + hv)
        g, beta = g.to(tl.float32), beta.to(tl.float32)
        h = h * tl.exp(g)
        delta = (vt - tl.sum(h * kt[None, :], axis=1)) * beta
        h = h + delta[:, None] * kt[None, :]
        o = tl.sum(h * qt[None, :], axis=1)
        o_ptrs = out.x + t64 * out.stride_t + hv * out.stride_h + vs
        tl.store(o_ptrs, o.to(out.x.dtype.element_ty), mask=vrows)
        if STEP_STATES:  # speculative verify: every token's state, for the accepted one to be kept
            step = tl.load(step_ptr + t64).to(tl.int64)
            if step >= 0:
                step_ptrs = slots.state + step * slots.stride_ss + s_row
                tl.store(step_ptrs, h.to(slots.state.dtype.element_ty), mask=real)
    if not STEP_STATES:
        tl.store(s_ptrs, h.to(slots.state.dtype.element_ty), mask=real)


def gated_delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    *,
    has_initial_state: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    step_state_indices: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
    block_v: int | None = None,
    num_warps: int = 1,
    gating: Gating | None = None,
) -> torch.Tensor:
    """Gated delta rule, token by token (see atom_kernels.gdn.ref for the math and layouts).

    q, k: [T, HK, Dk]; v: [T, HV, Dv]; g (log decay, fp32), beta: [T, HV]; cu_seqlens: [S+1] int32;
    state: [slots, HV, Dv, Dk] fp32 or bf16, read from and written back to state_indices [S] (-1:
    padding, output rows zero); has_initial_state: [S] bool or int8 (False / 0: start from zeros).
    step_state_indices: [T] int (speculative verify): the state after token t goes to that slot (-1:
    nowhere) and the sequence's own slot is not written at the end (name it for one of its tokens to
    update it in place). Returns o [T, HV, Dv] in v's dtype. No host sync: decode steps capture in
    CUDA graphs. block_v / num_warps: the tile (value rows of the state per program), for sweeps; by
    default one warp a program and about 32k programs (sweep_gdn_decode.py: nearer copy bandwidth at
    B=64 and B=256 than 32 rows and 4 warps), and at least about 2k at small batch (B=1: 2 rows).
    gating: pass g = beta = None and gdn_gating's inputs instead; the kernel computes g and beta per
    token as gdn_gating does (one launch fewer).
    """
    if (gating is None) == (g is None) or (g is None) != (beta is None):
        raise ValueError("gated_delta_rule_recurrent takes g and beta, or gating (with g = beta = None)")
    if gating is not None:
        check_gating(*gating)
        if gating.a.shape != (q.shape[0], v.shape[1] if v.dim() == 3 else -1):
            raise ValueError(f"gating's a and b must be [T, HV], got {tuple(gating.a.shape)}")
        if resolve_backend(backend, q.device) is Backend.TORCH:  # the reference takes g and beta
            (g, beta), gating = gdn_gating_ref(*gating), None
    slots = SequenceSlots(cu_seqlens, state_indices, has_initial_state, step_state_indices)
    call = GdnCall(q, k, v, g, beta, state, slots, use_qk_l2norm)
    out, done = gdn_entry(call, out=out, backend=backend)
    if done:
        return out
    cu_seqlens, state_indices, has_initial_state, step_state_indices = unit_stride(
        cu_seqlens, state_indices, has_initial_state, step_state_indices
    )
    seqs, (_, num_v_heads, dv), dk = state_indices.numel(), v.shape, q.shape[2]
    if seqs == 0:
        return out
    pdl = pdl_launch(q.device)
    bk, bv = padded_head_size(dk), triton.next_power_of_2(dv)
    if block_v is None:  # [block_v, Dk] fp32 of state per program: 32 registers a thread at 8 x 128
        rows = seqs * num_v_heads * dv  # value rows of state the call updates
        # A few sequences take value blocks down to 2 rows, so their states spread over about 2k programs
        # (sweep_gdn_decode.py: one row a program loses to the q/k norms each program repeats).
        # (The CPU interpreter keeps 8: it pays per program.)
        few = 8 if SETTINGS.triton_interpret else min(8, max(2, triton.next_power_of_2(rows // 2048)))
        block_v = min(bv, 32, max(few, triton.next_power_of_2(rows // 32768)))
    _recurrent_kernel[(seqs, num_v_heads, triton.cdiv(dv, block_v))](
        *(token_heads(x) for x in (q, k, v, out)),
        *((g, beta, gating_ptrs(q)) if gating is None else (q, q, gating_ptrs(q, gating))),
        state_slots(state, state_indices, has_initial_state), cu_seqlens,
        step_state_indices if step_state_indices is not None else state_indices, num_v_heads,
        num_v_heads // q.shape[1], dk**-0.5, DK=dk, DV=dv, BK=bk, BLOCK_V=block_v, L2NORM=use_qk_l2norm,
        HAS_INIT=has_initial_state is not None, STEP_STATES=step_state_indices is not None,
        FUSED_GATING=gating is not None, PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
    )  # fmt: skip
    return out
