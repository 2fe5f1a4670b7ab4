"""The grammar's part of a draw: before it, each constrained row's disallowed tokens are set to -inf (its
matcher fills the row of a bitmask on the host, the mask is applied on the logits' device to those rows
only); after it, the drawn token advances the row's matcher. A row whose grammar allows only the tokens
min_tokens still bans may draw them: the constraint is complete, and ends the output."""

from __future__ import annotations

import functools
import os

import torch

from atom_core.engine.scheduling.sequence import Sequence

# rows from which fills and advances go to llguidance's threads (below, handing them over costs more)
PARALLEL_FROM = 8


def mask_disallowed(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """logits: [B, V], row b sequence seqs[b]'s; rows without a grammar (or None, or whose grammar has
    ended) are not touched."""
    rows = [b for b, s in enumerate(seqs) if s is not None and s.grammar is not None and not s.grammar.ended]
    if not rows:
        return
    # pinned where the logits are on a GPU: the copy then queues behind the forward instead of waiting
    # for it, so the rows are filled while the forward runs (PyTorch's host allocator keeps the buffer
    # until its copy is done)
    pinned = logits.device.type == "cuda"
    bitmask = torch.empty((len(rows), (logits.shape[1] + 31) // 32), dtype=torch.int32, pin_memory=pinned)
    matchers = [seqs[b].grammar for b in rows]
    if len(rows) < PARALLEL_FROM:
        for i, matcher in enumerate(matchers):
            matcher.fill(bitmask, i)
    else:  # llguidance's threads fill the rows (outside the GIL)
        from llguidance.torch import fill_next_token_bitmask_par

        fill_next_token_bitmask_par(_executor(), [(m.inner, i) for i, m in enumerate(matchers)], bitmask)
        for i, matcher in enumerate(matchers):
            matcher.allow_stops(bitmask, i)
    ending = {b: _only_stops_allowed(bitmask[i], seqs[b]) for i, b in enumerate(rows)}
    index = torch.tensor(rows, dtype=torch.long, pin_memory=pinned)
    apply_bitmask(
        logits, bitmask.to(logits.device, non_blocking=pinned), index.to(logits.device, non_blocking=pinned)
    )
    for b, stops in ending.items():
        if stops:  # (penalties.py took them to -inf before min_tokens)
            logits[b, torch.tensor(stops, device=logits.device)] = 0.0


def _only_stops_allowed(allowed: torch.Tensor, seq: Sequence) -> list[int]:
    """The tokens min_tokens bans from seq's row this step where its grammar allows nothing else (its
    constrained output is complete, so min_tokens cannot be met: the grammar ends the output, stop_check),
    else []. allowed: the row of the bitmask, int32 [W]."""
    if len(seq.output_token_ids) >= seq.params.min_tokens or not seq.min_tokens_stops:
        return []
    rest = allowed.clone()
    stops = [t for t in sorted(seq.min_tokens_stops) if t < 32 * rest.numel() and _bit(rest, t)]
    for t in stops:
        rest[t >> 5] = int(rest[t >> 5]) & ~(1 << (t & 31))
    return stops if stops and not bool(rest.any()) else []


def _bit(words: torch.Tensor, t: int) -> bool:
    return bool((int(words[t >> 5]) >> (t & 31)) & 1)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """logits[rows[i], t] = -inf wherever bit t of bitmask[i] is 0, in place.

    logits: [B, V]; bitmask: int32 [R, W] with 32 * W >= V (bit t % 32 of word t // 32); rows: long [R]."""
    with torch.inference_mode():  # (the forward's logits are inference tensors)
        shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
        allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(bitmask.shape[0], -1)[:, : logits.shape[1]]
        picked = logits.index_select(0, rows)
        logits.index_copy_(0, rows, picked.masked_fill(allowed == 0, float("-inf")))


@functools.cache
def _executor():
    from llguidance import LLExecutor

    return LLExecutor(num_threads=min(8, os.cpu_count() or 1))


def accept_first(pairs: list[tuple[Sequence, int]]) -> dict[int, bool]:
    """Advance the matchers of distinct sequences by each one's first new token, on llguidance's threads
    from PARALLEL_FROM of them (a step's 64 rows otherwise cost 64 calls in a row between two forwards);
    -> id(sequence): whether its grammar accepted the token."""
    if len(pairs) < PARALLEL_FROM:
        return {id(seq): seq.grammar.accept(token) for seq, token in pairs}
    from llguidance.torch import consume_token_par

    found, consumed = {}, []
    for seq, token in pairs:
        if seq.grammar.ends_with(token):
            found[id(seq)] = True
        else:
            consumed.append((seq, token))
    ok = consume_token_par(_executor(), [(seq.grammar.inner, token) for seq, token in consumed])
    found.update((id(seq), accepted) for (seq, _), accepted in zip(consumed, ok, strict=True))
    return found


def accept(seq: Sequence, token: int) -> bool:
    """Advance seq's matcher by its new token; False if the grammar does not allow it."""
    return seq.grammar is None or seq.grammar.accept(token)
