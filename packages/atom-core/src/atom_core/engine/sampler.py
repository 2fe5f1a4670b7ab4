"""Token sampling: greedy, temperature, top-k, top-p, min-p; per-request seeded generators; logprobs."""

from __future__ import annotations

import torch

from atom_core.engine.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]):
    """logits: [B, V] -> (tokens [B] list, per row the {token: logprob} dict or None)."""
    logits = logits.float()
    logprobs_all = torch.log_softmax(logits, dim=-1) if any(p.logprobs is not None for p in params) else None
    tokens: list[int] = []
    logprobs: list[dict[int, float] | None] = []
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        x = logits[row]
        token = int(x.argmax()) if p.greedy else _sample_row(x / p.temperature, p, gen)
        tokens.append(token)
        if logprobs_all is None or p.logprobs is None:
            logprobs.append(None)
            continue
        lp = logprobs_all[row]
        top = {int(t): float(lp[t]) for t in lp.topk(p.logprobs).indices} if p.logprobs else {}
        top[token] = float(lp[token])
        logprobs.append(top)
    return tokens, logprobs


def _sample_row(x: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
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
    probs = probs.cpu()  # the request's seeded generator lives on the CPU
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
