"""Speculative decoding: the verification of a sequence's drafted tokens against the target's logits at the
positions that drafted them (the engine proposes, verifies and rolls back; llm_engine.py).

The draft proposes greedily (its argmax). Greedy requests accept the longest prefix of drafts equal to the
target's argmax and add the target's own token after it. Sampled requests do the same with the token the
target samples at each position: at the position of draft d, x is drawn from the target's (temperature,
top-k, top-p, min-p) distribution p with that position's key (sampler.draw_key); d is kept
iff x == d, else x is emitted and the step stops; after every draft was kept, the bonus token is drawn at
the next position the same way.

This is rejection sampling against the one-hot draft distribution q = [d], coupled to the target's own
draw. Rejection sampling keeps d with probability min(1, p(d) / q(d)) = p(d) and on rejection draws from
max(0, p - q) renormalised, which is p without d, renormalised. Here d is kept iff x == d: probability
p(d); and given x != d, x is distributed as p restricted to tokens != d, renormalised: the same law, so
each emitted token is distributed exactly as p, as without speculation. The coupling adds what rejection
sampling's fresh randomness cannot: the emitted token at each position is the very token plain sampling
draws there (same distribution, same uniform), so a seeded request's output is identical with and
without speculation, and whatever drafts were verified or dropped (short of KV blocks) on the way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from atom_core.engine.sampling.sampler import (
    NON_FINITE,
    SAMPLING_FAILED,
    SamplingRows,
    sample,
    sample_rows,
    token_logprobs,
)
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.host_copy import PendingRead


@dataclass(slots=True)
class Verified:
    """Per sequence: the tokens it emits this step (accepted drafts, then the target's own token), their
    logprobs if asked for, how many drafts were accepted, or why the sequence failed."""

    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[dict[int, float]] | None] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)

    def add(self, tokens: list[int], logprobs, error: str | None = None) -> None:
        self.tokens.append(tokens)
        self.logprobs.append(logprobs)
        self.accepted.append(max(len(tokens) - 1, 0))
        self.errors.append(error)


def verify_sampling(seqs: list[Sequence], drafts: list[list[int]]) -> SamplingRows | None:
    """How the verify step's forward draws its rows on the device (row j of a sequence: its token at
    output position len(output_token_ids) + j; logprobs are read later for the emitted tokens alone), or
    None when a request is penalized (its penalties are applied on the host)."""
    if any(seq.params.penalized for seq in seqs):
        return None
    rows = SamplingRows.of(
        [seq for seq, draft in zip(seqs, drafts, strict=True) for _ in range(len(draft) + 1)],
        [
            len(seq.output_token_ids) + j
            for seq, draft in zip(seqs, drafts, strict=True)
            for j in range(len(draft) + 1)
        ],
    )
    rows.logprobs = [-1] * len(rows.logprobs)
    return rows


def verify(
    logits: torch.Tensor,
    seqs: list[Sequence],
    drafts: list[list[int]],
    *,
    backend: str | None = None,
    drawn: PendingRead | None = None,
) -> Verified:
    """logits [R, V]: for each sequence in order, len(drafts[i]) + 1 rows (its last known token, then each
    draft). Row j of a sequence is its token at output position len(output_token_ids) + j: every row of
    every sequence is drawn in one batch (sampler.sample_rows: greedy rows their argmax) and read once.
    Penalized requests (never drafted for: their penalties would depend on the drafts) are sampled apart,
    their penalties applied on the host. backend: the engine's kernel backend. drawn: [2, R], every row
    already drawn on the device as verify_sampling says (the forward did), on its way to the host: read
    here instead."""
    starts = [0]
    for draft in drafts:
        starts.append(starts[-1] + len(draft) + 1)
    rows_of = [range(starts[i], starts[i + 1]) for i in range(len(seqs))]
    penalized = [i for i, s in enumerate(seqs) if s.params.penalized]
    apart = (
        sample(logits[[starts[i] for i in penalized]], [seqs[i] for i in penalized], backend=backend)
        if penalized
        else None
    )
    apart_of = {i: j for j, i in enumerate(penalized)}
    unpenalized = [i for i in range(len(seqs)) if i not in apart_of]
    flat = [r for i in unpenalized for r in rows_of[i]]
    tokens, status = [0] * len(logits), [0] * len(logits)
    if drawn is not None:
        if penalized:
            raise ValueError("verify: rows drawn in the forward cannot carry a penalized request's draw")
        tokens, status = drawn.tolist()
    elif flat:
        rows = SamplingRows.of(
            [seqs[i] for i in unpenalized for _ in rows_of[i]],
            [len(seqs[i].output_token_ids) + j for i in unpenalized for j in range(len(rows_of[i]))],
        )
        rows.logprobs = [-1] * len(flat)  # read below, for the tokens emitted only
        picked = logits if len(flat) == len(logits) else logits[flat]
        found, got = sample_rows(picked, rows, backend=backend)[0].tolist()
        for r, t, st in zip(flat, found, got, strict=True):
            tokens[r], status[r] = t, st
    out = Verified()
    wanted = []  # (sequence index, first row) of those that return logprobs: read in one batch
    for i, (seq, draft) in enumerate(zip(seqs, drafts, strict=True)):
        rows = rows_of[i]
        if i in apart_of:
            j = apart_of[i]
            token, lp = apart.tokens[j], apart.logprobs[j]
            out.add([] if token is None else [token], None if lp is None else [lp], apart.errors[j])
            continue
        if any(status[r] == 0 for r in rows):
            out.add([], None, NON_FINITE)
            continue
        try:
            if not draft:
                if status[rows[0]] != 1:
                    raise RuntimeError(SAMPLING_FAILED)
                emitted = [tokens[rows[0]]]
            elif seq.params.greedy:
                emitted = _accept(tokens[rows.start : rows.stop].__getitem__, draft)
            else:
                drawn_here = (tokens[rows.start : rows.stop], status[rows.start : rows.stop])
                emitted = _accept_sampled(logits[rows.start : rows.stop], draft, seq, drawn_here)
        except RuntimeError:  # a distribution with nothing to draw (sampler.sample_rows' status -1)
            out.add([], None, SAMPLING_FAILED)
            continue
        out.add(emitted, None)
        if seq.params.logprobs is not None:
            wanted.append((i, starts[i]))
    if wanted:
        rows = [start + j for i, start in wanted for j in range(len(out.tokens[i]))]
        emitted = [t for i, _ in wanted for t in out.tokens[i]]
        tops = [seqs[i].params.logprobs for i, _ in wanted for _ in out.tokens[i]]
        found = iter(token_logprobs(logits[rows], emitted, tops))
        for i, _ in wanted:
            out.logprobs[i] = [next(found) for _ in out.tokens[i]]
    return out


def _accept(target: Callable[[int], int], draft: list[int]) -> list[int]:
    """The target's tokens at rows 0, 1, ... (target(j)) while they equal the drafts: each draft it equals,
    then its first differing token, or the bonus token after the last draft."""
    tokens = []
    for j, proposed in enumerate(draft):
        tokens.append(target(j))
        if tokens[-1] != proposed:
            return tokens
    tokens.append(target(len(draft)))
    return tokens


def _accept_sampled(
    logits: torch.Tensor, draft: list[int], seq: Sequence, drawn: tuple[list[int], list[int]] | None = None
) -> list[int]:
    """The coupling of the module docstring: row j's token is seq's sampled token at output position
    len(output_token_ids) + j. drawn: those tokens and their statuses, drawn already (verify draws every
    sequence's in one batch); None: drawn here."""
    if drawn is None:
        first, n = len(seq.output_token_ids), len(draft) + 1
        found = sample_rows(logits, SamplingRows.of([seq] * n, list(range(first, first + n))))[0]
        drawn = tuple(found.tolist())
    tokens, status = drawn

    def target(j: int) -> int:
        if status[j] != 1:
            raise RuntimeError(SAMPLING_FAILED)
        return tokens[j]

    return _accept(target, draft)
