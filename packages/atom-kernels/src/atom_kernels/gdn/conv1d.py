"""Causal depthwise conv1d of GDN's mixed q/k/v channels, varlen with per-request conv state slots.

Prefill and decode are one path: decode is a batch of one-token sequences. Outputs come first (each
program reads the old state for its sequence's first W-1 positions), then a second launch shifts the
sequence's last W-1 inputs into its slot, so no program reads a state another has overwritten. Where
one program holds a whole sequence (decode, chunks up to 32 tokens) and only the final window is kept,
that program shifts the window itself after its reads: one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.gdn.call import ConvCall, SequenceSlots, Snapshots
from atom_kernels.gdn.inputs import unit_stride
from atom_kernels.gdn.packs import state_slots
from atom_kernels.gdn.ref import causal_conv1d_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _sequence(cu_ptr, slots, seq, HAS_INIT: tl.constexpr, PDL: tl.constexpr):
    """Sequence seq's state slot (-1: padding), first token, length, and whether its old window counts
    (False for a new request, whatever its slot held). Every kernel here starts with it: with PDL the
    kernel is placed while the previous one finishes and waits here, before its first read (slots, bounds
    and windows are all written inside a step)."""
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    slot = tl.load(slots.indices + seq).to(tl.int64)
    start = tl.load(cu_ptr + seq)
    length = tl.load(cu_ptr + seq + 1) - start
    use_state = length >= 0  # all True
    if HAS_INIT:
        use_state = tl.load(slots.init + seq) != 0
    return slot, start, length, use_state


@triton.jit
def _spread(flag, N: tl.constexpr):
    """A scalar condition as an [N] mask: Triton 3.9's CPU interpreter turns a tensor & scalar-condition
    mask into int32, which its loads refuse."""
    return (tl.zeros([N], dtype=tl.int32) + flag.to(tl.int32)) != 0


@triton.jit
def _conv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    slots,
    cu_ptr,
    dim,
    stride_x,
    stride_out,
    WIDTH: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SHIFT_STATE: tl.constexpr,  # one program holds the whole sequence: it also writes the new window
    BLOCK_W: tl.constexpr,
    PDL: tl.constexpr,
):
    slot, start, length, use_state = _sequence(cu_ptr, slots, tl.program_id(0), HAS_INIT, PDL)
    if slot < 0:  # a padding sequence: nothing to compute
        return
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    if tl.program_id(2) * BLOCK_T < length:
        _conv_rows(x_ptr, w_ptr, bias_ptr, out_ptr, slots, slot, start, length, use_state, d, dim, stride_x,
                   stride_out, WIDTH, HAS_BIAS, SILU, BLOCK_T, BLOCK_D)  # fmt: skip
    if SHIFT_STATE:
        # The window after the last token, read before any of it is written; no other program reads
        # this sequence's window (the grid's time dimension is 1), so no second launch has to wait.
        j = tl.arange(0, BLOCK_W)
        mask = d[:, None] < dim
        row = slots.state + slot * slots.stride_ss + d[:, None].to(tl.int64) * slots.stride_sh
        new = _window(x_ptr, row, start, length, d, j, mask, stride_x, use_state, WIDTH, BLOCK_W)
        tl.debug_barrier()  # every thread's reads of the old window (here and in the rows) come first
        tl.store(row + j[None, :], new.to(slots.state.dtype.element_ty), mask=mask & (j < WIDTH - 1)[None, :])


@triton.jit
def _conv_rows(
    x_ptr, w_ptr, bias_ptr, out_ptr, slots, slot, start, length, use_state, d, dim, stride_x, stride_out,
    WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The outputs of this program's BLOCK_T positions of the sequence, channels d."""
    i = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)  # positions within the sequence
    d_ok = d < dim
    row_ok = i < length
    rows_from_state = row_ok & _spread(use_state, BLOCK_T)
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    for w in tl.static_range(WIDTH):
        src = i - (WIDTH - 1) + w  # input position feeding tap w; < 0 comes from the state
        from_x = tl.load(
            x_ptr + (start + src).to(tl.int64)[:, None] * stride_x + d[None, :],
            mask=(row_ok & (src >= 0))[:, None] & d_ok[None, :],
            other=0.0,
        )
        hist = (WIDTH - 1) + src
        from_state = tl.load(
            slots.state + slot * slots.stride_ss + d[None, :].to(tl.int64) * slots.stride_sh + hist[:, None],
            mask=(rows_from_state & (src < 0))[:, None] & d_ok[None, :],
            other=0.0,
        )
        tap = tl.load(w_ptr + d * WIDTH + w, mask=d_ok, other=0.0).to(tl.float32)
        acc += (from_x.to(tl.float32) + from_state.to(tl.float32)) * tap[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    out = out_ptr + (start + i).to(tl.int64)[:, None] * stride_out + d[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _window(
    x_ptr, row, start, upto, d, j, mask, stride_x, use_state, WIDTH: tl.constexpr, BLOCK_W: tl.constexpr
):
    """The last W-1 inputs up to the sequence's first `upto` tokens, [BLOCK_D, BLOCK_W] fp32: column j
    holds position upto - (W-1) + j, from x, or from the old window (row) before the sequence's start."""
    src = upto - (WIDTH - 1) + j
    j_ok = j < WIDTH - 1
    from_x = tl.load(
        x_ptr + (start + src).to(tl.int64)[None, :] * stride_x + d[:, None],
        mask=mask & (j_ok & (src >= 0))[None, :],
        other=0.0,
    )
    old = tl.load(
        row + (WIDTH - 1 + src)[None, :],
        mask=mask & (j_ok & (src < 0) & _spread(use_state, BLOCK_W))[None, :],
        other=0.0,
    )
    return from_x.to(tl.float32) + old.to(tl.float32)


@triton.jit
def _state_kernel(
    x_ptr,
    slots,
    cu_ptr,
    snapshot_slots,
    snapshot_lens,
    dim,
    stride_x,
    WIDTH: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_SNAPSHOTS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_W: tl.constexpr,
    PDL: tl.constexpr,
):
    """The window after the sequence's last token to its slot, and with HAS_SNAPSHOTS the window after
    its first snapshot_lens[seq] tokens to slot snapshot_slots[seq] (-1: none); both are read before
    either is written."""
    seq = tl.program_id(0)
    slot, start, length, use_state = _sequence(cu_ptr, slots, seq, HAS_INIT, PDL)
    if slot < 0:
        return
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, BLOCK_W)
    mask = d[:, None] < dim
    store = mask & (j < WIDTH - 1)[None, :]
    row = slots.state + slot * slots.stride_ss + d[:, None].to(tl.int64) * slots.stride_sh
    new = _window(x_ptr, row, start, length, d, j, mask, stride_x, use_state, WIDTH, BLOCK_W)
    if HAS_SNAPSHOTS:
        snap_slot = tl.load(snapshot_slots + seq).to(tl.int64)
        upto = tl.load(snapshot_lens + seq)
        taken = (snap_slot >= 0) & (upto >= 1) & (upto <= length)
        upto = tl.where(taken, upto, length)  # (no read past the sequence for a length out of range)
        kept = _window(x_ptr, row, start, upto, d, j, mask, stride_x, use_state, WIDTH, BLOCK_W)
        taken = _spread(taken, BLOCK_W)
        snap_row = row + (snap_slot - slot) * slots.stride_ss
        tl.store(snap_row + j[None, :], kept.to(slots.state.dtype.element_ty), mask=store & taken[None, :])
    tl.store(row + j[None, :], new.to(slots.state.dtype.element_ty), mask=store)


@triton.jit
def _step_state_kernel(
    x_ptr,
    slots,
    cu_ptr,
    step_ptr,
    dim,
    stride_x,
    WIDTH: tl.constexpr,
    HAS_INIT: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_W: tl.constexpr,
    PDL: tl.constexpr,
):
    """Speculative verify: the window after each token t goes to slot step[t]. The old state is read
    once, before any write, since a step slot may be the sequence's own."""
    slot, start, length, use_state = _sequence(cu_ptr, slots, tl.program_id(0), HAS_INIT, PDL)
    if slot < 0:
        return
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c = tl.arange(0, BLOCK_W)
    mask = d[:, None] < dim
    c_ok = c < WIDTH - 1
    old = tl.load(
        slots.state + slot * slots.stride_ss + d[:, None].to(tl.int64) * slots.stride_sh + c[None, :],
        mask=mask & (c_ok & _spread(use_state, BLOCK_W))[None, :],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_D, BLOCK_W]
    tl.debug_barrier()
    for t in range(0, length):
        step = tl.load(step_ptr + start + t).to(tl.int64)
        if step >= 0:
            src = t - (WIDTH - 2) + c  # window column c holds input position src
            from_x = tl.load(
                x_ptr + (start + src).to(tl.int64)[None, :] * stride_x + d[:, None],
                mask=mask & (c_ok & (src >= 0))[None, :],
                other=0.0,
            ).to(tl.float32)
            # column src + W-1 of the old state, picked by a one-hot product (registers are not indexable)
            pick = (c[None, :] == (src + WIDTH - 1)[:, None]) & (src < 0)[:, None]  # [window col, old col]
            from_old = tl.sum(old[:, None, :] * pick[None, :, :].to(tl.float32), axis=2)
            row = slots.state + step * slots.stride_ss + d[:, None].to(tl.int64) * slots.stride_sh
            tl.store(
                row + c[None, :],
                (from_x + from_old).to(slots.state.dtype.element_ty),
                mask=mask & c_ok[None, :],
            )


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    state_indices: torch.Tensor,
    *,
    has_initial_state: torch.Tensor | None = None,
    activation: bool = True,
    max_seqlen: int | None = None,
    step_state_indices: torch.Tensor | None = None,
    snapshots: Snapshots | None = None,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Depthwise causal conv (then SiLU) of each sequence, continuing from and updating its state slot.

    x: [T, D] (rows may be strided, last dim contiguous); weight: [D, W]; bias: [D] or None;
    cu_seqlens: [S+1] int32; conv_state: [slots, D, W-1] (last dim contiguous), the last W-1 inputs;
    state_indices: [S] int (-1: a padding sequence: its rows of out are not written, zeros unless out is
    given, and no state is touched);
    has_initial_state: [S] bool or int8, False / 0 starts from zeros. Decode is S one-token sequences (max_seqlen=1).
    max_seqlen: the longest sequence, if the caller knows it (sizes the grid; default T, which is
    always enough but launches idle programs when there are many sequences).
    step_state_indices: [T] int (speculative verify): the last W-1 inputs up to token t go to that slot
    (-1: nowhere), and the sequence's own slot is written only where named.
    snapshots: the last W-1 inputs up to a sequence's first lens[s] tokens also go to slot slots[s]
    (call.Snapshots; not with step_state_indices).
    Returns out [T, D] in x's dtype.
    """
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(
            f"x [T, D] and weight [D, W] expected, got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    dim, width = weight.shape
    if conv_state.dim() != 3 or conv_state.shape[1:] != (dim, width - 1) or conv_state.stride(-1) != 1:
        raise ValueError(f"conv_state must be [slots, {dim}, {width - 1}], got {tuple(conv_state.shape)}")
    if cu_seqlens.shape != (state_indices.numel() + 1,):
        raise ValueError(
            f"cu_seqlens [S+1] and state_indices [S] disagree: {tuple(cu_seqlens.shape)}, {tuple(state_indices.shape)}"
        )
    if step_state_indices is not None and step_state_indices.shape != (x.shape[0],):
        raise ValueError(
            f"step_state_indices must be [T] = [{x.shape[0]}], got {tuple(step_state_indices.shape)}"
        )
    if x.stride(-1) != 1 or not weight.is_contiguous():
        raise ValueError("causal_conv1d needs x's last dimension and weight contiguous")
    sequences = SequenceSlots(cu_seqlens, state_indices, has_initial_state, step_state_indices, snapshots)
    if out is None:
        out = torch.zeros_like(x, memory_format=torch.contiguous_format)
    if resolve_backend(backend, x.device) is Backend.TORCH:
        want = causal_conv1d_ref(ConvCall(x, weight, bias, conv_state, sequences, activation))
        return out.copy_(want)
    seqs = state_indices.numel()
    if seqs == 0 or x.shape[0] == 0:
        return out
    cu_seqlens, state_indices, has_initial_state, step_state_indices = unit_stride(
        cu_seqlens, state_indices, has_initial_state, step_state_indices
    )
    max_len = max_seqlen or x.shape[0]  # a bound known without reading the lengths on the host
    block_t, block_d = min(32, triton.next_power_of_2(max_len)), min(128, triton.next_power_of_2(dim))
    slots = state_slots(conv_state, state_indices, has_initial_state)  # stride_sh: a channel's window
    grid = (seqs, triton.cdiv(dim, block_d), triton.cdiv(max_len, block_t))
    block_w = triton.next_power_of_2(max(1, width - 1))
    # one program a sequence (decode, short chunks) and only the final window kept: one launch
    shift = grid[2] == 1 and step_state_indices is None and snapshots is None
    pdl = pdl_launch(x.device)
    _conv_kernel[grid](
        x, weight, bias if bias is not None else weight, out, slots, cu_seqlens, dim, x.stride(0),
        out.stride(0), WIDTH=width,
        HAS_BIAS=bias is not None, HAS_INIT=has_initial_state is not None, SILU=activation, BLOCK_T=block_t,
        BLOCK_D=block_d, SHIFT_STATE=shift, BLOCK_W=block_w, PDL=pdl, launch_pdl=pdl,
    )  # fmt: skip
    if shift:
        return out
    state_grid = (seqs, triton.cdiv(dim, block_d))
    flags = dict(
        WIDTH=width,
        HAS_INIT=has_initial_state is not None,
        BLOCK_D=block_d,
        BLOCK_W=block_w,
        PDL=pdl,
        launch_pdl=pdl,
    )
    if step_state_indices is not None:
        _step_state_kernel[state_grid](x, slots, cu_seqlens, step_state_indices, dim, x.stride(0), **flags)
        return out
    kept = (state_indices, cu_seqlens) if snapshots is None else unit_stride(snapshots.slots, snapshots.lens)
    _state_kernel[state_grid](
        x, slots, cu_seqlens, *kept, dim, x.stride(0), HAS_SNAPSHOTS=snapshots is not None, **flags
    )
    return out
