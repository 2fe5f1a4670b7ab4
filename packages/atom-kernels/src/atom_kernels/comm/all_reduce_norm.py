"""All-reduce over peer memory fused with the residual add and RMSNorm that follow it in a decoder layer.

Tensor parallelism sums each row-parallel projection's partial output over the ranks, and the next thing
a decoder layer does is add the residual and normalize. Here one launch does all three, one program per
row: it publishes its partial row in its rank's symmetric buffer, meets the same program on every rank
at one barrier, sums every rank's copy in rank order (fp32), adds the residual, normalizes, and writes the
normalized row and the new residual.

One barrier, not the two of `one_shot_all_reduce`: the buffers alternate between two halves by call, and
the flags carry a per-program call count instead of 0/1. A rank can only publish call c + 1 of a program
after its call c passed the barrier, which needs every peer's kernel of call c to have started, so every
peer finished reading call c - 1, the half call c + 1 overwrites. Counts only grow, so a flag never needs
lowering (int64: no wrap). A program always owns the same row of each half, so calls of different row
counts interleave safely; every call on one set of buffers must use the same row width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.comm.one_shot import MAX_PROGRAMS
from atom_kernels.norm.ref import rms_norm_ref

MAX_ROWS = MAX_PROGRAMS  # one program per row, all resident at once (each spins until its peers arrive)


def fused_flag_slots(world: int) -> int:
    """int64 flags one rank's flag array needs (zeroed before first use): one per (peer, program)."""
    return world * MAX_ROWS


@triton.jit
def _all_reduce_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    buffers,
    flags,
    counts,
    half_elems,
    hidden,
    eps,
    weight_offset,
    rank,
    HAS_RESIDUAL: tl.constexpr,
    WORLD: tl.constexpr,
    MAX_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    dtype = x_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    call = tl.load(counts + row) + 1
    base = (call % 2) * half_elems + row.to(tl.int64) * hidden  # this call's half, this program's row
    mine = tl.load(x_ptr + row.to(tl.int64) * hidden + cols, mask=mask, other=0.0)
    own_buffer = tl.load(buffers + rank).to(tl.pointer_type(dtype))
    tl.store(own_buffer + base + cols, mine, mask=mask)
    tl.debug_barrier()  # every thread's copy is issued before the flag that publishes it
    for peer in tl.static_range(WORLD):  # release: the copy above is visible before the count
        pad = tl.load(flags + peer).to(tl.pointer_type(tl.int64))
        tl.atomic_xchg(pad + rank * MAX_ROWS + row, call, sem="release", scope="sys")
    own_flags = tl.load(flags + rank).to(tl.pointer_type(tl.int64))
    for peer in tl.static_range(WORLD):
        while tl.atomic_add(own_flags + peer * MAX_ROWS + row, 0, sem="acquire", scope="sys") < call:
            pass
    tl.debug_barrier()
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for peer in tl.static_range(WORLD):
        if peer == rank:
            acc += mine.to(tl.float32)
        else:
            src = tl.load(buffers + peer).to(tl.pointer_type(dtype))
            # .cg: past L1, which may hold this address from two calls ago (peer writes do not
            # invalidate it)
            acc += tl.load(src + base + cols, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    s = acc.to(dtype)  # the all-reduce's result, rounded as one_shot_all_reduce rounds it
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row.to(tl.int64) * hidden + cols, mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(dtype)  # rounded like sum + residual
    tl.store(res_out_ptr + row.to(tl.int64) * hidden + cols, s, mask=mask)
    sf = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / hidden + eps)
    normed = (sf * inv).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if weight_offset != 0.0:
        w = (w + weight_offset).to(w_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * hidden + cols, (w * normed).to(dtype), mask=mask)
    tl.store(counts + row, call)  # only this program touches its count; the next launch sees it


def all_reduce_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    *,
    buffers: torch.Tensor,
    flags: torch.Tensor,
    counts: torch.Tensor,
    half_bytes: int,
    rank: int,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum + residual), sum + residual), sum = x summed over all ranks (fp32, rank order).

    x: this rank's partial [T, H], contiguous; residual: [T, H] like x, or None (the new residual is then
    the sum itself); weight: [H]; weight_offset as `rms_norm`'s. buffers: int64 [world] addresses of each
    rank's symmetric data buffer (2 * half_bytes each); flags: int64 [world] addresses of each rank's
    symmetric flag array (fused_flag_slots(world) int64, zero at first use); counts: int64 [MAX_ROWS] on
    this rank's device, zero at first use, private to these buffers. T * H * itemsize <= half_bytes, and
    T <= MAX_ROWS. Every rank calls it with the same shapes, in the same order relative to its other calls
    on these buffers, and every call on them uses the same H. Returns new tensors (out, new_residual).
    """
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"all_reduce_rms_norm needs a contiguous [T, H] x, got {tuple(x.shape)}")
    tokens, hidden = x.shape
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}], got {tuple(weight.shape)}")
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous()
    ):
        raise ValueError(f"residual must be a contiguous {tuple(x.shape)} {x.dtype} tensor")
    world = buffers.numel()
    if flags.numel() != world or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world} buffers and {flags.numel()} flag arrays")
    if tokens > MAX_ROWS or x.numel() * x.element_size() > half_bytes:
        raise ValueError(
            f"{tokens} rows of {hidden} exceed the buffers ({half_bytes} bytes a call, {MAX_ROWS} rows)"
        )
    if counts.dtype != torch.int64 or counts.numel() < MAX_ROWS:
        raise ValueError(f"counts must be int64 [{MAX_ROWS}], got {counts.dtype} [{counts.numel()}]")
    out, new_residual = torch.empty_like(x), torch.empty_like(x)
    if tokens:
        block = triton.next_power_of_2(hidden)
        _all_reduce_rms_norm_kernel[(tokens,)](
            x,
            residual if residual is not None else x,
            weight,
            out,
            new_residual,
            buffers,
            flags,
            counts,
            half_bytes // x.element_size(),
            hidden,
            eps,
            weight_offset,
            rank,
            HAS_RESIDUAL=residual is not None,
            WORLD=world,
            MAX_ROWS=MAX_ROWS,
            BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    return out, new_residual


def all_reduce_rms_norm_ref(
    xs: list[torch.Tensor],
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What all_reduce_rms_norm gives on every rank: the rank-order fp32 sum rounded to x's dtype, then
    rms_norm_ref with the residual (or the sum as the new residual)."""
    acc = torch.zeros_like(xs[0], dtype=torch.float32)
    for x in xs:
        acc += x.float()
    s = acc.to(xs[0].dtype)
    if residual is None:
        return rms_norm_ref(s, weight, eps, None, weight_offset), s
    return rms_norm_ref(s, weight, eps, residual, weight_offset)
