"""Token sampling: greedy, temperature, top-k, top-p, min-p; per-request seeded generators; logprobs."""

from __future__ import annotations

import torch

from atom_core.engine.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]):
    """logits: [B, V] -> (tokens [B] list, per row the {token: logprob} dict or None).

    Greedy rows take one batched argmax (one device-to-host copy per step, not one per row).
    """
    if all(p.greedy and p.logprobs is None for p in params):  # bf16 -> fp32 is exact: the same argmax
        return logits.argmax(dim=-1).tolist(), [None] * len(params)
    logits = logits.float()
    tokens = logits.argmax(dim=-1).tolist()
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            tokens[row] = _sample_row(logits[row] / p.temperature, p, gen)
    logprobs: list[dict[int, float] | None] = [None] * len(params)
    wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
    if wanted:
        lp = torch.log_softmax(logits[wanted], dim=-1).cpu()
        for i, row in enumerate(wanted):
            k = params[row].logprobs
            top = {int(t): float(lp[i, t]) for t in lp[i].topk(k).indices} if k else {}
            top[tokens[row]] = float(lp[i, tokens[row]])
            logprobs[row] = top
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
