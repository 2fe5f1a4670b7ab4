"""The grammar's part of a draw: before it, each constrained row's disallowed tokens are set to -inf (its
matcher fills the row of a bitmask on the host; xgrammar applies the mask in place on the logits'
device, to those rows only); after it, the drawn token advances the row's matcher."""

from __future__ import annotations

import functools
import os

import torch

from atom_core.engine.scheduling.sequence import Sequence


def mask_disallowed(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """logits: [B, V], row b sequence seqs[b]'s; rows without a grammar are not touched."""
    rows = [b for b, s in enumerate(seqs) if s.grammar is not None]
    if not rows:
        return
    import xgrammar as xgr

    # pinned where the logits are on a GPU: the copy then queues behind the forward instead of waiting
    # for it, so the rows are filled while the forward runs (PyTorch's host allocator keeps the buffer
    # until its copy is done)
    pinned = logits.device.type == "cuda"
    width = (logits.shape[1] + 31) // 32
    bitmask = torch.full((len(seqs), width), -1, dtype=torch.int32, pin_memory=pinned)
    if len(rows) < PARALLEL_FROM:
        applied = [
            b for b in rows if seqs[b].grammar.fill_next_token_bitmask(bitmask, b)
        ]  # False: all allowed
    else:  # xgrammar's threads fill the rows (outside the GIL)
        _batch_filler().batch_fill_next_token_bitmask([seqs[b].grammar for b in rows], bitmask, indices=rows)
        applied = rows
    if applied:
        on_device = bitmask.to(logits.device, non_blocking=pinned)
        xgr.apply_token_bitmask_inplace(logits, on_device, indices=applied)


PARALLEL_FROM = 4  # rows from which the fill is spread over threads (below, starting them costs more)


@functools.cache
def _batch_filler():
    import xgrammar as xgr

    return xgr.BatchGrammarMatcher(max_threads=min(8, os.cpu_count() or 1))


def accept(seq: Sequence, token: int) -> bool:
    """Advance seq's matcher by its new token; False if the grammar does not allow it."""
    return seq.grammar is None or seq.grammar.accept_token(token)
