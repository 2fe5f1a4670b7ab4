"""All-reduce over peer memory fused with the residual add and RMSNorm that follow it in a decoder layer.

Tensor parallelism sums each row-parallel projection's partial output over the ranks, and the next thing
a decoder layer does is add the residual and normalize. Here one launch does all three, one program per
row: it pushes its partial row into every peer's buffer, waits for every peer's row in its own buffer,
sums them in rank order (fp32), adds the residual, normalizes, and writes the normalized row and the new
residual.

No barrier and no fence: every 8-byte word pushed carries 4 bytes of the row and, beside them, the
program's call count. A word is written whole, so a reader that finds the count it expects in every word
of a row has that call's row. The buffers alternate between two halves by call: a rank pushes call c + 1
of a program only after its call c, which needed every peer's call-c push, so every peer finished call
c - 1 and its reads of the half call c + 1 overwrites. A program always owns the same row of each half,
so calls of different row counts interleave safely; every call on one set of buffers must use the same
row width. With PDL (pdl.py) a program loads the norm's weight before its wait and touches its count, x
and every buffer after it, so the argument above holds in stream order as without it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.norm.ref import rms_norm_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs

MAX_ROWS = 512  # one program per row, all resident at once (each spins until its peers' rows arrive)
_WORD_BYTES = 4  # the row's bytes each 8-byte word carries beside its count


def fused_buffer_bytes(world: int, half_bytes: int) -> int:
    """Bytes of one rank's symmetric buffer for calls of up to half_bytes of rows: two halves, each a
    region per source rank with every 4 bytes of the row widened to an 8-byte word."""
    return 2 * world * half_bytes * (8 // _WORD_BYTES)


@triton.jit
def _all_reduce_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    buffers,
    counts,
    region_words,
    hidden,
    eps,
    weight_offset,
    rank,
    HAS_RESIDUAL: tl.constexpr,
    WORLD: tl.constexpr,
    PACK: tl.constexpr,
    WORDS: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    row = tl.program_id(0).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    words_per_row = hidden // PACK
    w_idx = tl.arange(0, WORDS)
    w_mask = w_idx < words_per_row
    # elements as [word, element of the word]: element e sits in word e // PACK
    cols = w_idx[:, None] * PACK + tl.arange(0, PACK)[None, :]
    mask = cols < hidden
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # a constant: before the wait
    wait_for_inputs(PDL)
    call = tl.load(counts + row) + 1
    tag = (call & 0xFFFFFFFF) << 32  # the count in each word's high half (equality survives the wrap)
    mine = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0)
    bits = tl.load(
        x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row * words_per_row + w_idx, mask=w_mask
    )
    word = tag | (bits.to(tl.int64) & 0xFFFFFFFF)
    slot = (call % 2) * WORLD + rank  # this call's half, this rank's region, in every peer's buffer
    for peer in tl.static_range(WORLD):
        if peer != rank:
            dst = tl.load(buffers + peer).to(tl.pointer_type(tl.int64))
            tl.store(dst + slot * region_words + row * words_per_row + w_idx, word, mask=w_mask)
    own = tl.load(buffers + rank).to(tl.pointer_type(tl.int64))
    acc = tl.zeros([WORDS, PACK], dtype=tl.float32)
    for peer in tl.static_range(WORLD):
        if peer == rank:
            acc += mine.to(tl.float32)
        else:
            src = own + ((call % 2) * WORLD + peer) * region_words + row * words_per_row + w_idx
            got = tl.load(src, mask=w_mask, other=0, volatile=True)
            while tl.min(tl.where(w_mask, ((got >> 32) & 0xFFFFFFFF) == (call & 0xFFFFFFFF), 1)) == 0:
                got = tl.load(src, mask=w_mask, other=0, volatile=True)
            data = got.to(tl.int32)  # the low half: the peer's 4 bytes of its row
            if PACK == 2:  # two 16-bit elements, the first in the low bits
                halves = (data[:, None] >> (16 * tl.arange(0, 2))[None, :]).to(tl.int16)
                acc += halves.to(dtype, bitcast=True).to(tl.float32)
            else:
                acc += data[:, None].to(dtype, bitcast=True).to(tl.float32)
    s = acc.to(dtype)  # the all-reduce's result, rounded as one_shot_all_reduce rounds it
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * hidden + cols, mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(dtype)  # rounded like sum + residual
    tl.store(res_out_ptr + row * hidden + cols, s, mask=mask)
    sf = tl.where(mask, s.to(tl.float32), 0.0)
    inv = 1.0 / tl.sqrt(tl.sum(tl.sum(sf * sf, axis=1), axis=0) / hidden + eps)
    normed = (sf * inv).to(dtype).to(tl.float32)
    if weight_offset != 0.0:
        w = (w + weight_offset).to(w_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (w * normed).to(dtype), mask=mask)
    tl.store(counts + row, call)  # only this program touches its count; the next launch sees it


def all_reduce_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    *,
    buffers: torch.Tensor,
    counts: torch.Tensor,
    half_bytes: int,
    rank: int,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum + residual), sum + residual), sum = x summed over all ranks (fp32, rank order).

    x: this rank's partial [T, H], contiguous, 16- or 32-bit floats (H even for 16-bit); residual: [T, H]
    like x, or None (the new residual is then the sum itself); weight: [H]; weight_offset as `rms_norm`'s.
    buffers: int64 [world] addresses of each rank's symmetric buffer (fused_buffer_bytes(world,
    half_bytes) each, zero at first use); counts: int64 [MAX_ROWS] on this rank's device, zero at first
    use, private to these buffers. T * H * itemsize <= half_bytes and T <= MAX_ROWS. Every rank calls it
    with the same shapes, in the same order relative to its other calls on these buffers, and every call
    on them uses the same H. Returns new tensors (out, new_residual).
    """
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"all_reduce_rms_norm needs a contiguous [T, H] x, got {tuple(x.shape)}")
    tokens, hidden = x.shape
    pack = _WORD_BYTES // x.element_size()
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or hidden % pack:
        raise ValueError(
            f"all_reduce_rms_norm takes 16-bit rows of even width or fp32, got {x.dtype} [.., {hidden}]"
        )
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}], got {tuple(weight.shape)}")
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous()
    ):
        raise ValueError(f"residual must be a contiguous {tuple(x.shape)} {x.dtype} tensor")
    world = buffers.numel()
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world} buffers")
    if tokens > MAX_ROWS or x.numel() * x.element_size() > half_bytes:
        raise ValueError(
            f"{tokens} rows of {hidden} exceed the buffers ({half_bytes} bytes a call, {MAX_ROWS} rows)"
        )
    if counts.dtype != torch.int64 or counts.numel() < MAX_ROWS:
        raise ValueError(f"counts must be int64 [{MAX_ROWS}], got {counts.dtype} [{counts.numel()}]")
    out, new_residual = torch.empty_like(x), torch.empty_like(x)
    if tokens:
        words = triton.next_power_of_2(hidden // pack)
        pdl = pdl_launch(x.device)
        region_words = half_bytes // _WORD_BYTES  # the 8-byte words of one (half, source rank) region
        _all_reduce_rms_norm_kernel[(tokens,)](
            x, residual if residual is not None else x, weight, out, new_residual, buffers, counts,
            region_words, hidden, eps, weight_offset, rank, HAS_RESIDUAL=residual is not None, WORLD=world,
            PACK=pack, WORDS=words, PDL=pdl, num_warps=min(16, max(1, words // 128)), launch_pdl=pdl,
        )  # fmt: skip
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
