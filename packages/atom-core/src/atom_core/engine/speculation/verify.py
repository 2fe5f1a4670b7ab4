"""Speculative decoding: the verification of a sequence's drafted tokens against the target's logits at the
positions that drafted them (the engine proposes, verifies and rolls back; llm_engine.py).

The draft proposes greedily (its argmax). Greedy requests accept the longest prefix of drafts equal to the
target's argmax and add the target's own token after it. Sampled requests do the same with the token the
target samples at each position: at the position of draft d, x is drawn from the target's (temperature,
top-k, top-p, min-p) distribution p with that position's keyed uniform (sampler.draw_uniform); d is kept
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
from atom_kernels.sampling import greedy_tokens


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


def verify(
    logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]], *, backend: str | None = None
) -> Verified:
    """logits [R, V]: for each sequence in order, len(drafts[i]) + 1 rows (its last known token, then each
    draft). Sequences without drafts are sampled together as without speculation (penalized requests are
    never drafted for: their penalties would depend on the drafts). backend: the engine's kernel backend,
    for the rows' argmax and finiteness (greedy_tokens)."""
    starts = [0]
    for draft in drafts:
        starts.append(starts[-1] + len(draft) + 1)
    plain_rows = [i for i, d in enumerate(drafts) if not d]
    plain = (
        sample(logits[[starts[i] for i in plain_rows]], [seqs[i] for i in plain_rows], backend=backend)
        if plain_rows
        else None
    )
    plain_of = {i: j for j, i in enumerate(plain_rows)}
    argmax, finite = greedy_tokens(logits, backend=backend).tolist()
    rows_of = [range(starts[i], starts[i + 1]) for i in range(len(seqs))]
    # every sampled sequence's rows drawn in one batch (one read of the device)
    drawing = [i for i, (s, d) in enumerate(zip(seqs, drafts, strict=True)) if d and not s.params.greedy]
    drawing = [i for i in drawing if all(finite[r] for r in rows_of[i])]
    drawn = _draw(logits, {i: (seqs[i], rows_of[i]) for i in drawing})
    out = Verified()
    wanted = []  # (sequence index, first row) of those that return logprobs: read in one batch
    for i, (seq, draft) in enumerate(zip(seqs, drafts, strict=True)):
        rows = slice(starts[i], starts[i + 1])
        if not draft:
            j = plain_of[i]
            token, lp = plain.tokens[j], plain.logprobs[j]
            out.add([] if token is None else [token], None if lp is None else [lp], plain.errors[j])
            continue
        if not all(finite[rows]):
            out.add([], None, NON_FINITE)
            continue
        if seq.params.greedy:
            tokens = _accept(argmax[rows].__getitem__, draft)
        else:
            try:
                tokens = _accept_sampled(logits[rows], draft, seq, drawn[i])
            except RuntimeError:  # a distribution with nothing to draw (sampler.draw_rows)
                out.add([], None, SAMPLING_FAILED)
                continue
        out.add(tokens, None)
        if seq.params.logprobs is not None:
            wanted.append((i, starts[i]))
    if wanted:
        rows = [start + j for i, start in wanted for j in range(len(out.tokens[i]))]
        tokens = [t for i, _ in wanted for t in out.tokens[i]]
        tops = [seqs[i].params.logprobs for i, _ in wanted for _ in out.tokens[i]]
        found = iter(token_logprobs(logits[rows], tokens, tops))
        for i, _ in wanted:
            out.logprobs[i] = [next(found) for _ in out.tokens[i]]
    return out


def _draw(logits: torch.Tensor, spans: dict[int, tuple[Sequence, range]]) -> dict:
    """{i: (tokens, statuses)} of each sequence at its rows (row j: its sampled token at output position
    len(output_token_ids) + j), drawn in one sample_rows batch."""
    if not spans:
        return {}
    flat = [r for _, span in spans.values() for r in span]
    seqs = [s for s, span in spans.values() for _ in span]
    positions = [len(s.output_token_ids) + j for s, span in spans.values() for j in range(len(span))]
    drawn, _ = sample_rows(logits[flat], SamplingRows.of(seqs, positions))
    tokens, status = drawn.tolist()
    found, at = {}, 0
    for i, (_, span) in spans.items():
        found[i] = (tokens[at : at + len(span)], status[at : at + len(span)])
        at += len(span)
    return found


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
