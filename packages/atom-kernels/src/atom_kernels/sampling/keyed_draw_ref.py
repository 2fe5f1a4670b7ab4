"""What a keyed draw is: the torch reference of keyed_draw (keyed_draw.py), in float64.

A sampled row of logits x [V] with temperature T, top-k, top-p and min-p is drawn from with a 64-bit
key, never with a torch.Generator, so the token depends on (logits, parameters, key) alone:

- weights e_i = exp((x_i - max x) / T); a token is kept when x_i is at or above the k-th largest logit
  (ties included), e_i >= min_p (min-p is relative to the most likely token, whose e is 1) and e_i > 0;
- top-p keeps each kept token whose mass strictly above it, sum(e_j : e_j > e_i), is at most top_p times
  the kept mass: the smallest set whose mass reaches top_p, with every token tied at its edge kept;
- the token is drawn without sorting, by rejection. Round r draws, with the uniform uniform_of(key, r),
  from the inverse CDF in vocabulary order over the kept tokens with e above a pivot (round 0: all kept
  tokens): the first token whose cumulative weight passes u * total. A draw is accepted when the mass
  above it is within top-p; otherwise the pivot rises to the drawn token's e and the next round draws.

The top-p set is every kept token with e at or above some threshold, so a rejected draw lies below all of
it and the next round's candidates still hold the whole set. Each round draws from a set that contains
the top-p set, proportionally to e, so conditioned on acceptance the token is distributed exactly as the
normalised top-p set; each rejection removes at least the drawn token, so the rounds end.

Round 0's uniform is the key's top 53 bits, so a row without top-p draws what an inverse CDF over its
softmax draws with that uniform.
"""

from __future__ import annotations

import torch

_U64 = 2**64 - 1


def splitmix64(x: int) -> int:
    """splitmix64's output function (Steele et al.): a bijection of 64-bit ints whose every output bit
    depends on every input bit, so nearby inputs give unrelated outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def uniform_of(key: int, round_: int) -> float:
    """Round round_'s uniform in [0, 1) of a draw keyed by key (an unsigned 64-bit int): its top 53 bits,
    of the key itself at round 0 and of splitmix64(key + round) after, so every double in [0, 1) that is a
    multiple of 2^-53 can come out."""
    mixed = key if round_ == 0 else splitmix64((key + round_) & _U64)
    return (mixed >> 11) * 2.0**-53


def as_signed(key: int) -> int:
    """An unsigned 64-bit key as the int64 a tensor stores (same bits)."""
    return key - 2**64 if key >= 2**63 else key


def kth_logits(logits: torch.Tensor, top_k: torch.Tensor, k_max: int | None = None) -> torch.Tensor:
    """The k-th largest logit of each row [S] (float32), -inf where top_k keeps everything (k <= 0 or
    k >= V): a token is kept by top-k when its logit is at or above it. logits [S, V], top_k [S] int;
    k_max: the largest top_k below V (known on the host: None reads it from top_k, a device sync)."""
    vocab = logits.shape[1]
    used = (top_k > 0) & (top_k < vocab)
    kth = torch.full(top_k.shape, float("-inf"), dtype=torch.float32, device=logits.device)
    if logits.shape[0] == 0 or vocab < 2:
        return kth
    if k_max is None:
        k_max = int(torch.where(used, top_k, 1).max())
    k_max = max(1, min(k_max, vocab - 1))
    values = logits.float().topk(k_max, dim=-1).values
    picked = values.gather(1, (torch.where(used, top_k, 1) - 1).long()[:, None])[:, 0]
    return torch.where(used, picked, kth)


def keyed_draw_ref(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    keys: torch.Tensor,
    *,
    fragile_within: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The module docstring's draw of each row. logits [S, V]; temperature (> 0), top_p (in (0, 1]) and
    min_p (in [0, 1]) [S] float; top_k [S] int (<= 0: all); keys [S] int64 (the unsigned keys' bits).
    Returns the tokens [S] int64 and whether each row had anything to draw [S] bool (a row whose logits
    are not finite draws nothing meaningful: the caller checks finiteness).

    fragile_within: also return [S] bool, the rows where some comparison the draw made (a cumulative
    weight against its target, the mass above a draw against top-p's bound, a weight against min-p) was
    closer than this fraction of the row's mass: fp32 kernels may decide those rows the other way."""
    rows, vocab = logits.shape
    device = logits.device
    x = logits.double()
    kth = kth_logits(logits, top_k).double()
    peak = x.max(dim=-1, keepdim=True).values
    e = torch.exp((x - peak) / temperature.double()[:, None]).nan_to_num(nan=0.0)
    kept = (x >= kth[:, None]) & (e >= min_p.double()[:, None]) & (e > 0)
    e = torch.where(kept, e, 0.0)
    total0 = e.sum(dim=-1)
    drew = torch.isfinite(total0) & (total0 > 0)
    bound = top_p.double() * total0
    fragile = torch.zeros(rows, dtype=torch.bool, device=device)
    if fragile_within is not None:
        scale = fragile_within * torch.where(drew, total0, 1.0)[:, None]
        near_min_p = ((e - min_p.double()[:, None]).abs() * total0[:, None] < scale) & (min_p[:, None] > 0)
        fragile |= near_min_p.any(dim=-1)
    tokens = torch.zeros(rows, dtype=torch.int64, device=device)
    pivot = torch.zeros(rows, dtype=torch.float64, device=device)
    done = ~drew
    unsigned = [k % 2**64 for k in keys.tolist()]
    round_ = 0
    while not bool(done.all()):
        candidates = torch.where(e > pivot[:, None], e, 0.0)
        total = candidates.sum(dim=-1)
        if round_ > 0:  # the last round's draw is checked: the mass above it within top-p
            if fragile_within is not None:
                fragile |= ~done & ((total - bound).abs() < fragile_within * total0)
            done |= total <= bound
        live = ~done
        u = torch.tensor([uniform_of(k, round_) for k in unsigned], dtype=torch.float64, device=device)
        target = u * total
        cdf = candidates.cumsum(dim=-1)
        token = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]
        last = vocab - 1 - (candidates.flip(-1) > 0).int().argmax(dim=-1)
        token = torch.where(token >= vocab, last, token)
        if fragile_within is not None:
            gap = torch.minimum(
                (cdf.gather(1, token[:, None])[:, 0] - target).abs(),
                (cdf.gather(1, (token - 1).clamp(min=0)[:, None])[:, 0] - target).abs(),
            )
            fragile |= live & (gap < fragile_within * total0)
        tokens = torch.where(live, token, tokens)
        pivot = torch.where(live, e.gather(1, token[:, None])[:, 0], pivot)
        done |= live & (top_p >= 1)  # nothing to check
        round_ += 1
    if fragile_within is None:
        return tokens, drew
    return tokens, drew, fragile
