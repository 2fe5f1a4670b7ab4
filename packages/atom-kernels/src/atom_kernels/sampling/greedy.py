"""Greedy decoding's last step, argmax over the vocabulary and a finiteness check, in one launch.

torch runs them as two reductions and a stack (at one row of a 128k vocabulary the argmax's single row
goes to a few blocks, and isfinite(...).all() is another full pass). Here each
row is cut into chunks, one program per (row, chunk), so the row is read by many SMs at once; each
program stores its chunk's maximum, the first index holding it and whether every value was finite, and
the last program of the row (tile_tickets.py) combines the chunks in index order. Ties give the first
index, as torch.argmax does. A row with a NaN or an infinity is marked not finite and its token is
whatever the comparisons gave: the caller discards it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.settings import Backend, resolve_backend
from atom_kernels.tile_tickets import MAX_TICKET_TILES, draws_last, reset_ticket, tile_counters

CHUNK = 4096  # vocabulary entries a program reads (32 programs a row for a 128k vocabulary)
_BLOCK = 2048  # entries a loop step loads


@triton.jit
def _greedy_kernel(
    logits_ptr,
    out_ptr,
    part_val_ptr,
    part_idx_ptr,
    part_ok_ptr,
    counter_ptr,
    rows,
    vocab,
    stride_row,
    chunks,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row, chunk = tl.program_id(0), tl.program_id(1)
    start = chunk * CHUNK
    offs = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32) + start
    ok = tl.full([], 1, tl.int32)
    base = logits_ptr + row.to(tl.int64) * stride_row
    for k in range(start, tl.minimum(start + CHUNK, vocab), BLOCK):
        cols = k + offs
        inside = cols < vocab
        x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32)
        finite = (x == x) & (tl.abs(x) < float("inf"))
        ok = ok & tl.min(tl.where(inside, finite, True).to(tl.int32), axis=0)
        m = tl.max(x, axis=0)
        first = tl.min(tl.where(x == m, cols, 2**31 - 1), axis=0)
        better = m > best  # strictly: an equal maximum in a later step keeps the earlier index
        best_idx = tl.where(better, first, best_idx)
        best = tl.where(better, m, best)
    slot = row * chunks + chunk
    tl.store(part_val_ptr + slot, best)
    tl.store(part_idx_ptr + slot, best_idx)
    tl.store(part_ok_ptr + slot, ok)
    if draws_last(counter_ptr, row, chunks):  # every chunk's partial in one load each, not a loop
        c = tl.arange(0, BLOCK_C)
        here = c < chunks
        v = tl.load(part_val_ptr + row * chunks + c, mask=here, other=float("-inf"), cache_modifier=".cg")
        i = tl.load(part_idx_ptr + row * chunks + c, mask=here, other=0, cache_modifier=".cg")
        good = tl.load(part_ok_ptr + row * chunks + c, mask=here, other=1, cache_modifier=".cg")
        top = tl.max(v, axis=0)
        # the first chunk holding the maximum (chunk 0 where every value is -inf), then its index
        first = tl.min(tl.where(v == top, c, BLOCK_C), axis=0)
        first = tl.where(first == BLOCK_C, 0, first)
        top_idx = tl.sum(tl.where(c == first, i, 0), axis=0)
        tl.store(out_ptr + row, top_idx.to(tl.int64))
        tl.store(out_ptr + rows + row, tl.min(good, axis=0).to(tl.int64))
        reset_ticket(counter_ptr, row)


def greedy_tokens_ref(logits: torch.Tensor) -> torch.Tensor:
    """logits: [B, V] -> int64 [2, B]: row 0 each row's argmax (first maximum), row 1 1 where every logit
    of the row is finite, else 0."""
    return torch.stack([logits.argmax(dim=-1), torch.isfinite(logits).all(dim=-1).long()])


def greedy_tokens(logits: torch.Tensor, *, backend: Backend | str | None = None) -> torch.Tensor:
    """The greedy token of each row and whether the row is finite: greedy_tokens_ref in one launch.

    logits: [B, V] float -> int64 [2, B] on logits' device. The kernel (which compares in fp32) runs for
    fp32 / fp16 / bf16 rows on a GPU (or with backend="triton" under the CPU interpreter), up to
    MAX_TICKET_TILES rows; otherwise torch (fp64 among them: fp32 would merge close values). No host
    sync: the caller's one copy to the host reads both rows."""
    if logits.dim() != 2:
        raise ValueError(f"greedy_tokens expects logits [B, V], got {tuple(logits.shape)}")
    rows, vocab = logits.shape
    chosen = resolve_backend(backend, logits.device)
    use_kernel = (
        chosen is not Backend.TORCH
        and (logits.is_cuda or backend is not None)
        and 0 < rows <= MAX_TICKET_TILES
        and vocab > 0
        and logits.stride(-1) == 1
        and logits.dtype in (torch.float32, torch.float16, torch.bfloat16)
    )
    if not use_kernel:
        return greedy_tokens_ref(logits)
    chunks = triton.cdiv(vocab, CHUNK)
    out = torch.empty(2, rows, dtype=torch.int64, device=logits.device)
    part_val = torch.empty(rows * chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(rows * chunks, dtype=torch.int32, device=logits.device)
    part_ok = torch.empty(rows * chunks, dtype=torch.int32, device=logits.device)
    _greedy_kernel[(rows, chunks)](
        logits, out, part_val, part_idx, part_ok, tile_counters(logits.device, rows), rows, vocab,
        logits.stride(0), chunks, CHUNK=CHUNK, BLOCK=min(_BLOCK, triton.next_power_of_2(vocab)),
        BLOCK_C=triton.next_power_of_2(chunks), num_warps=4,
    )  # fmt: skip
    return out
