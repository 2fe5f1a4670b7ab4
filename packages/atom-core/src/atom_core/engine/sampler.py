"""Token sampling: greedy, temperature, top-k, top-p, min-p, OpenAI/vLLM penalties; per-request seeded
generators; logprobs. A row whose logits are not finite, or whose sampling fails, fails alone: the other
rows of the batch are sampled as usual."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.engine.sequence import Sequence
from atom_kernels.sampling import greedy_tokens


@dataclass(slots=True)
class Sampled:
    tokens: list[int | None]  # None where the row failed
    logprobs: list[dict[int, float] | None]
    errors: list[str | None]  # why a row failed


def sample(logits: torch.Tensor, seqs: list[Sequence], *, backend: str | None = None) -> Sampled:
    """logits: [B, V], one row per sequence -> the next token of each (and its logprobs if asked for).

    Plain greedy rows take one batched argmax with the rows' finiteness (atom-kernels' greedy_tokens: one
    launch on a GPU, the engine's kernel backend; one device-to-host copy per step, not one per row).
    """
    params = [s.params for s in seqs]
    if all(p.greedy and p.logprobs is None and not p.penalized for p in params):
        tokens, ok = greedy_tokens(logits, backend=backend).tolist()
        errors = [None if good else NON_FINITE for good in ok]
        return Sampled(
            [t if good else None for t, good in zip(tokens, ok, strict=True)], [None] * len(seqs), errors
        )
    ok = torch.isfinite(logits).all(dim=-1).tolist()
    logits = logits.float()
    penalized = [row for row, p in enumerate(params) if p.penalized and ok[row]]
    if penalized:
        logits = logits.clone()
        for row in penalized:
            _apply_penalties(logits[row], seqs[row])
    tokens: list[int | None] = logits.argmax(dim=-1).tolist()
    errors: list[str | None] = [None if good else NON_FINITE for good in ok]
    for row, (p, seq) in enumerate(zip(params, seqs, strict=True)):
        if not ok[row]:
            tokens[row] = None
        elif not p.greedy:
            try:
                tokens[row] = _sample_row(logits[row], p, seq.generator)
            except RuntimeError:  # torch.multinomial refuses a distribution it cannot sample
                tokens[row], errors[row] = None, SAMPLING_FAILED
    logprobs: list[dict[int, float] | None] = [None] * len(seqs)
    wanted = [row for row, p in enumerate(params) if p.logprobs is not None and tokens[row] is not None]
    if wanted:
        found = token_logprobs(
            logits[wanted], [tokens[r] for r in wanted], [params[r].logprobs for r in wanted]
        )
        for row, top in zip(wanted, found, strict=True):
            logprobs[row] = top
    return Sampled(tokens, logprobs, errors)


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: list[int]) -> list[dict[int, float]]:
    """logits [R, V] -> per row, {token: logprob} for its top[row] most likely tokens and the one it emitted."""
    lp = torch.log_softmax(logits.float(), dim=-1).cpu()
    found = []
    for i, (token, k) in enumerate(zip(tokens, top, strict=True)):
        best = {int(t): float(lp[i, t]) for t in lp[i].topk(k).indices} if k else {}
        best[token] = float(lp[i, token])
        found.append(best)
    return found


NON_FINITE = "the model produced non-finite logits (NaN or Inf)"
SAMPLING_FAILED = "sampling failed: no token had a valid probability"


def _apply_penalties(row: torch.Tensor, seq: Sequence) -> None:
    """In place, as vLLM applies them: repetition over prompt and output tokens, presence and frequency
    over output tokens only.

    With a repetition penalty the row comes back shifted to a maximum of 0: dividing by a small penalty
    (validation accepts any in (0, 2]) takes logits past fp32's range, and softmax, argmax and log-softmax,
    all that reads the row, do not change under a shift."""
    p = seq.params
    if p.repetition_penalty != 1:
        _apply_repetition_penalty(row, torch.tensor(sorted(set(seq.token_ids)), device=row.device), p)
    if seq.output_token_ids and (p.presence_penalty or p.frequency_penalty):
        counts = torch.bincount(torch.tensor(seq.output_token_ids, device=row.device), minlength=row.numel())
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


def _apply_repetition_penalty(row: torch.Tensor, seen: torch.Tensor, p) -> None:
    """row [V] fp32, in place: seen tokens' positive logits divided by the penalty, negative ones
    multiplied, in float64, then the whole row shifted by its maximum and rounded back to fp32."""
    penalty = p.repetition_penalty
    wide = row.double()
    values = wide[seen]
    positive = values > 0
    wide[seen] = torch.where(positive, values / penalty, values * penalty)
    top = wide.max()
    if torch.isinf(top):
        # Past float64 too (a penalty under ~1e-270): the largest seen positive logit is then the row's
        # maximum by hundreds of orders of magnitude; the others' distances to it, divided, are what is left.
        best = values[positive].max()
        wide.fill_(float("-inf"))
        wide[seen] = torch.where(positive, (values - best) / penalty, float("-inf"))
        top = wide.new_zeros(())
    row.copy_((wide - top).float())


def _sample_row(x: torch.Tensor, p, gen: torch.Generator | None) -> int:
    probs = probabilities(x, p)
    return int(torch.multinomial(probs, 1, generator=gen))


def probabilities(x: torch.Tensor, p) -> torch.Tensor:
    """The distribution a sampled (not greedy) request draws from, for one row of logits [V]: temperature,
    top-k, min-p and top-p applied; on the CPU (the request's seeded generator lives there), summing to 1."""
    x = x.float() - x.max()  # the largest logit is 0: no overflow at any temperature >= eps
    # -inf (a penalized or masked token) stays -inf: a temperature past fp32's range is inf in fp32, and
    # -inf / inf would be NaN
    x = torch.where(x == float("-inf"), x, x / p.temperature)
    if p.top_k > 0 and p.top_k < x.numel():
        kth = x.topk(p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if p.min_p > 0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0)
    if p.top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(0) - sorted_probs > p.top_p  # keep the smallest set reaching top_p
        probs = probs.scatter(0, order, sorted_probs.masked_fill(outside, 0))
    probs = probs.cpu()
    return probs / probs.sum()
