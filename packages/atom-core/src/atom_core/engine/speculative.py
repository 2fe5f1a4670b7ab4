"""Speculative decoding: the verification of a sequence's drafted tokens against the target's logits at the
positions that drafted them (the engine proposes, verifies and rolls back; llm_engine.py).

The draft proposes greedily (its argmax). Greedy requests accept the longest prefix of drafts equal to the
target's argmax and add the target's own token after it. Sampled requests use rejection sampling against
that one-hot draft distribution: draft d is kept with probability p(d) under the target's (temperature,
top-k, top-p, min-p) distribution p; when rejected, the token is drawn from p without d, renormalised. Each
emitted token is then distributed exactly as p, as without speculation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from atom_core.engine.sampler import NON_FINITE, SAMPLING_FAILED, probabilities, sample, token_logprobs
from atom_core.engine.sequence import Sequence
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
    out = Verified()
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
            tokens = _accept_greedy(argmax[rows], draft)
        else:
            try:
                tokens = _accept_sampled(logits[rows], draft, seq)
            except RuntimeError:  # torch.multinomial refuses a distribution it cannot sample
                out.add([], None, SAMPLING_FAILED)
                continue
        k = seq.params.logprobs
        lps = None if k is None else token_logprobs(logits[rows][: len(tokens)], tokens, [k] * len(tokens))
        out.add(tokens, lps)
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
