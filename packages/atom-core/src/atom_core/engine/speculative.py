"""Speculative decoding: the verification of a sequence's drafted tokens against the target's logits at the
positions that drafted them (the engine proposes, verifies and rolls back; llm_engine.py).

The draft proposes greedily (its argmax). Greedy requests accept the longest prefix of drafts equal to the
target's argmax and add the target's own token after it. Sampled requests use rejection sampling against
that one-hot draft distribution: draft d is kept with probability p(d) under the target's (temperature,
top-k, top-p, min-p) distribution p; when rejected, the token is drawn from p without d, renormalised. Each
emitted token is then distributed exactly as p, as without speculation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.engine.sampler import probabilities, token_logprobs
from atom_core.engine.sequence import Sequence


@dataclass(slots=True)
class Verified:
    """Per sequence: the tokens it emits this step (accepted drafts, then the target's own token), their
    logprobs if asked for, how many drafts were accepted, or why the sequence failed."""

    tokens: list[list[int]]
    logprobs: list[list[dict[int, float]] | None]
    accepted: list[int]
    errors: list[str | None]


_NON_FINITE = "the model produced non-finite logits (NaN or Inf)"


def verify(logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]]) -> Verified:
    """logits [R, V]: for each sequence in order, len(drafts[i]) + 1 rows (its last known token, then each
    draft). Penalized requests are never drafted for (their penalties would depend on the drafts)."""
    counts = [len(d) + 1 for d in drafts]
    finite = torch.isfinite(logits).all(dim=-1)
    greedy_all = all(s.params.greedy for s in seqs)
    argmax, finite = torch.stack([logits.argmax(dim=-1), finite.long()]).tolist()
    out = Verified([], [], [], [])
    row = 0
    for seq, draft, n in zip(seqs, drafts, counts, strict=True):
        rows = slice(row, row + n)
        row += n
        if not all(finite[rows]):
            out.tokens.append([]), out.logprobs.append(None), out.accepted.append(0)
            out.errors.append(_NON_FINITE)
            continue
        if greedy_all or seq.params.greedy:
            tokens = _accept_greedy(argmax[rows], draft)
        else:
            try:
                tokens = _accept_sampled(logits[rows], draft, seq)
            except RuntimeError:  # torch.multinomial refuses a distribution it cannot sample
                out.tokens.append([]), out.logprobs.append(None), out.accepted.append(0)
                out.errors.append("sampling failed: no token had a valid probability")
                continue
        out.tokens.append(tokens)
        out.accepted.append(len(tokens) - 1)
        out.errors.append(None)
        k = seq.params.logprobs
        out.logprobs.append(
            None if k is None else token_logprobs(logits[rows][: len(tokens)], tokens, [k] * len(tokens))
        )
    return out


def _accept_greedy(argmax: list[int], draft: list[int]) -> list[int]:
    tokens = []
    for target, proposed in zip(argmax, draft, strict=False):
        tokens.append(target)
        if target != proposed:
            return tokens
    tokens.append(argmax[len(draft)])
    return tokens


def _accept_sampled(logits: torch.Tensor, draft: list[int], seq: Sequence) -> list[int]:
    tokens = []
    for j, proposed in enumerate(draft):
        p = probabilities(logits[j], seq.params)
        if float(torch.rand((), generator=seq.generator)) < float(p[proposed]):
            tokens.append(proposed)
            continue
        p[proposed] = 0  # rejected: the rest of p, renormalised (p(d) < 1 here, so something is left)
        tokens.append(int(torch.multinomial(p / p.sum(), 1, generator=seq.generator)))
        return tokens
    p = probabilities(logits[len(draft)], seq.params)
    tokens.append(int(torch.multinomial(p, 1, generator=seq.generator)))
    return tokens
