"""Chunked prefill of the gated delta rule: three launches, two of them parallel over every chunk.

Per chunk of C=64 tokens and value head (math as transformers' torch_chunk_gated_delta_rule):
1. prepare (all chunks at once): cumulative log decay, the strictly lower system A = (beta k k^T) *
   decay, its inverse T = (I + A)^-1 (A is nilpotent: the product of (I + (-A)^(2^i)), six small
   matmuls), then w = T (beta k exp(cum)) and u = T (beta v);
   and, for step 2, the keys decayed to the chunk's end and the chunk's whole decay;
2. state (sequential over a sequence's chunks, parallel over heads and value blocks): the state before
   each chunk, and the chunk's corrected values v_new = u - w S^T; the final state goes to the slot;
3. output (all chunks at once): o = (q exp(cum)) S_before^T + ((q k^T) * decay, causal) v_new.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.gdn.inputs import gdn_entry
from atom_kernels.settings import SETTINGS, Backend

CHUNK = 64


@triton.jit
def _rows_l2(x, L2NORM: tl.constexpr):
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _prepare_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, chunk_seq_ptr, chunk_start_ptr, cum_ptr, w_ptr, u_ptr, kd_ptr,
    decay_ptr, num_v_heads, group, stride_kt, stride_kh, stride_vt, stride_vh,
    C: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L2NORM: tl.constexpr, LOG2C: tl.constexpr,
    PREC_INV: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    t0 = tl.load(chunk_start_ptr + c)
    end = tl.load(cu_ptr + tl.load(chunk_seq_ptr + c) + 1)
    i = tl.arange(0, C)
    rows = (t0 + i).to(tl.int64)
    ok = t0 + i < end
    ks, vs = tl.arange(0, DK), tl.arange(0, DV)
    k = tl.load(
        k_ptr + rows[:, None] * stride_kt + (hv // group) * stride_kh + ks[None, :],
        mask=ok[:, None],
        other=0.0,
    )
    k = _rows_l2(k.to(tl.float32), L2NORM)
    g = tl.load(g_ptr + rows * num_v_heads + hv, mask=ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * num_v_heads + hv, mask=ok, other=0.0).to(tl.float32)
    cum = tl.cumsum(g, axis=0)
    slot = c * num_v_heads + hv
    tl.store(cum_ptr + slot * C + i, cum)
    kb = k * beta[:, None]
    lower = i[:, None] > i[None, :]
    decay = tl.exp(tl.where(lower, cum[:, None] - cum[None, :], float("-inf")))
    neg_a = -tl.dot(kb, tl.trans(k), input_precision=PREC_INV) * decay  # -A, strictly lower
    inv = tl.where(i[:, None] == i[None, :], 1.0, 0.0) + neg_a  # I - A
    power = neg_a
    for _ in tl.static_range(LOG2C - 1):  # (I + A)^-1 = (I - A)(I + A^2)(I + A^4)... (A^C = 0)
        power = tl.dot(power, power, input_precision=PREC_INV)
        inv = inv + tl.dot(inv, power, input_precision=PREC_INV)
    w = tl.dot(inv, kb * tl.exp(cum)[:, None], input_precision=PREC_INV)
    tl.store(w_ptr + slot * C * DK + i[:, None] * DK + ks[None, :], w.to(w_ptr.dtype.element_ty))
    v = tl.load(v_ptr + rows[:, None] * stride_vt + hv * stride_vh + vs[None, :], mask=ok[:, None], other=0.0)
    u = tl.dot(inv, v.to(tl.float32) * beta[:, None], input_precision=PREC_INV)
    tl.store(u_ptr + slot * C * DV + i[:, None] * DV + vs[None, :], u.to(u_ptr.dtype.element_ty))
    # For the sequential state kernel, done here in parallel: the keys decayed to the chunk's end, and the
    # chunk's whole decay (padding rows have g = 0, so the sum is the decay up to the last real token).
    total = tl.sum(g, axis=0)
    kd = k * tl.exp(total - cum)[:, None]  # padding rows of k are 0
    tl.store(kd_ptr + slot * C * DK + i[:, None] * DK + ks[None, :], kd.to(kd_ptr.dtype.element_ty))
    tl.store(decay_ptr + slot, tl.exp(total))


@triton.jit
def _state_kernel(
    first_chunk_ptr, idx_ptr, init_ptr, w_ptr, u_ptr, kd_ptr, decay_ptr, h_ptr, vnew_ptr, state_ptr, num_v_heads,
    stride_ss, stride_sh, C: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr,
    HAS_INIT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    # The only sequential part: per chunk two dependent matmuls on the state; every load in the loop
    # depends on the chunk index alone, so the next chunk's can be in flight (num_stages).
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    slot = tl.load(idx_ptr + seq).to(tl.int64)
    if slot < 0:
        return
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    ks = tl.arange(0, DK)
    i = tl.arange(0, C)
    s_ptrs = state_ptr + slot * stride_ss + hv * stride_sh + vs[:, None] * DK + ks[None, :]
    h = tl.load(s_ptrs).to(tl.float32)  # [BLOCK_V, DK]
    if HAS_INIT:  # a new request starts from zeros, whatever the slot held
        h = tl.where(tl.load(init_ptr + seq) != 0, h, 0.0)
    hv64 = hv.to(tl.int64)  # buffer offsets in int64: chunks * heads * 64 * 128 passes 2^31 at long prompts
    for c in range(tl.load(first_chunk_ptr + seq), tl.load(first_chunk_ptr + seq + 1)):
        slot_c = c * num_v_heads + hv64
        w = tl.load(w_ptr + slot_c * C * DK + i[:, None] * DK + ks[None, :]).to(tl.float32)
        u = tl.load(u_ptr + slot_c * C * DV + i[:, None] * DV + vs[None, :]).to(tl.float32)
        kd = tl.load(kd_ptr + slot_c * C * DK + i[:, None] * DK + ks[None, :]).to(tl.float32)
        decay = tl.load(decay_ptr + slot_c)
        tl.store(h_ptr + slot_c * DV * DK + vs[:, None] * DK + ks[None, :], h.to(h_ptr.dtype.element_ty))
        v_new = u - tl.dot(w, tl.trans(h), input_precision=PREC)  # [C, BLOCK_V]
        tl.store(
            vnew_ptr + slot_c * C * DV + i[:, None] * DV + vs[None, :], v_new.to(vnew_ptr.dtype.element_ty)
        )
        h = h * decay + tl.dot(tl.trans(v_new), kd, input_precision=PREC)
    tl.store(s_ptrs, h.to(state_ptr.dtype.element_ty))


@triton.jit
def _output_kernel(
    q_ptr, k_ptr, out_ptr, cu_ptr, chunk_seq_ptr, chunk_start_ptr, cum_ptr, h_ptr, vnew_ptr, idx_ptr,
    num_v_heads, group, scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh,
    C: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr, L2NORM: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    vs = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    seq = tl.load(chunk_seq_ptr + c)
    t0 = tl.load(chunk_start_ptr + c)
    end = tl.load(cu_ptr + seq + 1)
    i = tl.arange(0, C)
    ks = tl.arange(0, DK)
    rows = (t0 + i).to(tl.int64)
    ok = t0 + i < end
    o_ptrs = out_ptr + rows[:, None] * stride_ot + hv * stride_oh + vs[None, :]
    if tl.load(idx_ptr + seq) < 0:  # padding sequence: zeros
        tl.store(o_ptrs, tl.zeros([C, BLOCK_V], tl.float32).to(out_ptr.dtype.element_ty), mask=ok[:, None])
        return
    hk = hv // group
    q = tl.load(q_ptr + rows[:, None] * stride_qt + hk * stride_qh + ks[None, :], mask=ok[:, None], other=0.0)
    q = _rows_l2(q.to(tl.float32), L2NORM) * scale
    k = tl.load(k_ptr + rows[:, None] * stride_kt + hk * stride_kh + ks[None, :], mask=ok[:, None], other=0.0)
    k = _rows_l2(k.to(tl.float32), L2NORM)
    slot_c = c * num_v_heads + hv
    cum = tl.load(cum_ptr + slot_c * C + i)
    h = tl.load(h_ptr + slot_c * DV * DK + vs[:, None] * DK + ks[None, :]).to(tl.float32)
    o = tl.dot(q * tl.exp(cum)[:, None], tl.trans(h), input_precision=PREC)
    causal = i[:, None] >= i[None, :]
    attn = tl.dot(q, tl.trans(k), input_precision=PREC) * tl.exp(tl.where(causal, cum[:, None] - cum[None, :],
                                                                           float("-inf")))  # fmt: skip
    v_new = tl.load(vnew_ptr + slot_c * C * DV + i[:, None] * DV + vs[None, :]).to(tl.float32)
    o += tl.dot(attn, v_new, input_precision=PREC)
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def _chunk_map(cu_seqlens: torch.Tensor):
    """(chunk -> sequence, chunk -> first token, sequence -> first chunk [S+1]) on the device."""
    bounds = cu_seqlens.tolist()  # prefill is planned on the host (one sync), as engines do
    chunk_seq, chunk_start, first = [], [], [0]
    for s in range(len(bounds) - 1):
        starts = range(bounds[s], bounds[s + 1], CHUNK)
        chunk_seq += [s] * len(starts)
        chunk_start += list(starts)
        first.append(len(chunk_seq))
    dev = cu_seqlens.device
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    return as_tensor(chunk_seq), as_tensor(chunk_start), as_tensor(first)


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
) -> torch.Tensor:
    """Chunked gated delta rule for prefill; same arguments and result as `gated_delta_rule_recurrent`.

    Reads cu_seqlens on the host to plan the chunks (prefill only; decode uses the recurrent kernel).
    """
    out, done = gdn_entry(q, k, v, g, beta, cu_seqlens, state, state_indices, has_initial_state=has_initial_state,
                          use_qk_l2norm=use_qk_l2norm, out=out, backend=backend)  # fmt: skip
    if done:
        return out
    chunk_seq, chunk_start, first_chunk = _chunk_map(cu_seqlens)
    chunks, seqs = chunk_seq.numel(), state_indices.numel()
    if chunks == 0:
        return out
    num_v_heads, dv, dk = v.shape[1], v.shape[2], q.shape[2]
    group = num_v_heads // q.shape[1]
    # The inverse needs fp32 accuracy: 3-pass TF32 on NVIDIA tensor cores (plain fp32 dots of these tiles
    # spill); fp32 activations get it everywhere. The interpreter and ROCm take IEEE fp32.
    if SETTINGS.triton_interpret or torch.version.hip is not None:
        prec_inv = prec = "ieee"
    else:
        prec_inv, prec = "tf32x3", "tf32x3" if v.dtype == torch.float32 else "tf32"
    buf = dict(dtype=v.dtype, device=v.device)  # intermediates in the activations' dtype halve their traffic
    cum = torch.empty(chunks, num_v_heads, CHUNK, dtype=torch.float32, device=v.device)
    w = torch.empty(chunks, num_v_heads, CHUNK, dk, **buf)
    u = torch.empty(chunks, num_v_heads, CHUNK, dv, **buf)
    v_new = torch.empty(chunks, num_v_heads, CHUNK, dv, **buf)
    h = torch.empty(chunks, num_v_heads, dv, dk, **buf)
    kd = torch.empty(chunks, num_v_heads, CHUNK, dk, **buf)
    decay = torch.empty(chunks, num_v_heads, dtype=torch.float32, device=v.device)
    _prepare_kernel[(chunks, num_v_heads)](
        k, v, g, beta, cu_seqlens, chunk_seq, chunk_start, cum, w, u, kd, decay, num_v_heads, group, k.stride(0),
        k.stride(1),
        v.stride(0), v.stride(1), C=CHUNK, DK=dk, DV=dv, L2NORM=use_qk_l2norm, LOG2C=CHUNK.bit_length() - 1,
        PREC_INV=prec_inv, num_warps=4,
    )  # fmt: skip
    block_v = min(dv, 32)
    init = has_initial_state.to(torch.int8) if has_initial_state is not None else state_indices
    _state_kernel[(seqs, num_v_heads, dv // block_v)](
        first_chunk, state_indices, init, w, u, kd, decay, h, v_new, state, num_v_heads, state.stride(0),
        state.stride(1), C=CHUNK, DK=dk, DV=dv, BLOCK_V=block_v, HAS_INIT=has_initial_state is not None, PREC=prec,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    _output_kernel[(chunks, num_v_heads, dv // block_v)](
        q, k, out, cu_seqlens, chunk_seq, chunk_start, cum, h, v_new, state_indices, num_v_heads, group, dk**-0.5,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1), C=CHUNK, DK=dk, DV=dv,
        BLOCK_V=block_v, L2NORM=use_qk_l2norm, PREC=prec, num_warps=4,
    )  # fmt: skip
    return out
