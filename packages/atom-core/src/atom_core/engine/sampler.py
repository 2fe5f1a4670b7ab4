"""Token sampling: greedy, temperature, top-k, top-p, min-p, OpenAI/vLLM penalties; keyed randomness;
logprobs. A row whose logits are not finite, or whose sampling fails, fails alone: the other rows of the
batch are sampled as usual.

Keyed randomness: the token a sampled sequence emits at output position i is drawn from its distribution
with one uniform that is a function of (the sequence's seed, its sample index, i) alone (draw_uniform).
Nothing else (the batch, the steps before, how many speculative drafts were verified or dropped for lack
of KV blocks, preemption) moves a seeded request's text: a request with the same seed gives the same
tokens wherever it runs, with and without speculation (speculative.py draws the same way). Unseeded
requests get a random seed when their sequence is made: one code path.

The uniform is the top 53 bits of a splitmix64 mix of the key, and the token is read off the inverse CDF.
It is not a torch.Generator seeded with the key: the CPU generator keeps only its seed's low 32 bits
(mt19937), so keys would collide within a long request and across requests.
"""

from __future__ import annotations

import math
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
                tokens[row] = sample_token(logits[row], seq, len(seq.output_token_ids))
            except RuntimeError:  # a distribution with nothing to draw (draw_token)
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
    """logits [R, V] -> per row, {token: logprob} for its top[row] most likely tokens and the one it emitted.

    Floored at LOGPROB_FLOOR, as vLLM's OpenAI server does: a token a penalty or mask took to -inf (a tiny
    repetition penalty leaves most of the row there) is -inf here, and JSON has no -inf (a non-streamed
    response failed with a 500; a streamed one sent `-Infinity`, which JSON parsers refuse)."""
    lp = torch.log_softmax(logits.float(), dim=-1).cpu()
    # NaN too: a row is only here when its logits were finite and one of its tokens sampled, so NaN should
    # not happen, but no value that JSON cannot carry may leave the engine
    lp = lp.nan_to_num(nan=LOGPROB_FLOOR).clamp_(min=LOGPROB_FLOOR)
    found = []
    for i, (token, k) in enumerate(zip(tokens, top, strict=True)):
        best = {int(t): float(lp[i, t]) for t in lp[i].topk(k).indices} if k else {}
        best[token] = float(lp[i, token])
        found.append(best)
    return found


NON_FINITE = "the model produced non-finite logits (NaN or Inf)"
SAMPLING_FAILED = "sampling failed: no token had a valid probability"
LOGPROB_FLOOR = -9999.0  # vLLM's: the least logprob a response carries


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


def sample_token(x: torch.Tensor, seq: Sequence, position: int) -> int:
    """seq's token at output position `position` (its len(output_token_ids) when it is sampled) from one
    row of logits [V]: a draw from probabilities() with that position's keyed uniform."""
    return draw_token(probabilities(x, seq.params), draw_uniform(seq, position))


def draw_uniform(seq: Sequence, position: int) -> float:
    """A uniform in [0, 1) that depends on (seq's seed, its sample index, position) and nothing else."""
    key = _splitmix64(_splitmix64(_splitmix64(seq.sample_seed) ^ seq.index) ^ position)
    return (key >> 11) * 2.0**-53  # its top 53 bits: every double in [0, 1) a multiple of 2^-53


def draw_token(probs: torch.Tensor, u: float) -> int:
    """The token of probs [V] (>= 0, any positive total) at uniform u by the inverse CDF: the first whose
    cumulative probability passes u of the total. A token of probability 0 is never drawn."""
    cdf = probs.double().cumsum(0)  # float64: the sum of fp32 probabilities is exact enough
    total = float(cdf[-1])
    if not (math.isfinite(total) and total > 0):
        raise RuntimeError(SAMPLING_FAILED)
    token = int(torch.searchsorted(cdf, u * total, right=True))
    if token == probs.numel():  # u * total rounded up to the total: the last token that can be drawn
        token = int(probs.nonzero()[-1])
    return token


_U64 = 2**64 - 1


def _splitmix64(x: int) -> int:
    """splitmix64's output function (Steele et al.): a bijection of 64-bit ints whose every output bit
    depends on every input bit, so nearby keys (positions i and i + 1) give unrelated uniforms."""
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def probabilities(x: torch.Tensor, p) -> torch.Tensor:
    """The distribution a sampled (not greedy) request draws from, for one row of logits [V]: temperature,
    top-k, min-p and top-p applied; on the CPU (where its token is drawn), summing to 1."""
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
