"""Token sampling: greedy, temperature, top-k, top-p, min-p, OpenAI/vLLM penalties; keyed randomness;
logprobs. A row whose logits are not finite, or whose sampling fails, fails alone: the other rows of the
batch are sampled as usual.

Keyed randomness: the token a sampled sequence emits at output position i is drawn from its distribution
with a 64-bit key that is a function of (the sequence's seed, its sample index, i) alone (draw_key).
Nothing else (the batch, the steps before, how many speculative drafts were verified or dropped for lack
of KV blocks, preemption) moves a seeded request's text: a request with the same seed gives the same
tokens wherever it runs, with and without speculation (speculative.py draws the same way). Unseeded
requests get a random seed when their sequence is made: one code path.

The draw is atom-kernels' keyed_draw (keyed_draw_ref says what it draws): its uniforms are the key's top
53 bits, then mixes of it, and top-p is a rejection draw, so no row is sorted. It is not a torch.Generator
seeded with the key: the CPU generator keeps only its seed's low 32 bits (mt19937), so keys would collide
within a long request and across requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from atom_core.engine.sampling.penalties import apply_penalties
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.engine.structured.masking import mask_disallowed
from atom_core.host_copy import host_to_device, to_device
from atom_kernels.sampling import greedy_tokens, keyed_draw
from atom_kernels.sampling.keyed_draw_ref import as_signed, splitmix64


@dataclass(slots=True)
class Sampled:
    tokens: list[int | None]  # None where the row failed
    logprobs: list[dict[int, float] | None]
    errors: list[str | None]  # why a row failed


@dataclass(slots=True)
class SamplingRows:
    """How each row of a batch's logits is sampled, as plain lists (a tensor-parallel message carries
    them): the row's temperature (0: greedy), top-k (-1: all), top-p, min-p, its draw's 64-bit key
    (draw_key; unused by greedy rows) and how many top logprobs it returns (-1: none)."""

    temperatures: list[float]
    top_ks: list[int]
    top_ps: list[float]
    min_ps: list[float]
    keys: list[int]
    logprobs: list[int]
    # rows launched ahead of their sequence's output position (a verify after one whose acceptance the host
    # has not read): per row, its keys at the assumed position and 1, 2, ... before it; the device picks
    # the one its sequence's lag says (sample_rows' key_lag)
    lagged_keys: list[list[int]] = field(default_factory=list)

    @classmethod
    def of(cls, seqs: list[Sequence], positions: list[int]) -> SamplingRows:
        """Row i samples seqs[i]'s token at output position positions[i]."""
        params = [seq.params for seq in seqs]
        return cls(
            [0.0 if p.greedy else p.temperature for p in params],
            [p.top_k for p in params],
            [p.top_p for p in params],
            [p.min_p for p in params],
            [
                0 if p.greedy else draw_key(seq, position)
                for p, seq, position in zip(params, seqs, positions, strict=True)
            ],
            [-1 if p.logprobs is None else p.logprobs for p in params],
        )

    @property
    def plain_greedy(self) -> bool:
        return not any(self.temperatures) and all(k < 0 for k in self.logprobs)


@dataclass(slots=True)
class LogprobRows:
    """On the device, for the rows that asked for logprobs (rows): the sampled token's logprob [W] and
    the top max(k) logprobs and their tokens [W, max(k)], floored at LOGPROB_FLOOR."""

    rows: list[int]
    chosen: torch.Tensor
    top_values: torch.Tensor
    top_tokens: torch.Tensor

    def to_host(self, non_blocking: bool = False) -> LogprobRows:
        pin = non_blocking and self.chosen.is_cuda
        moved = [
            torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
            for t in (self.chosen, self.top_values, self.top_tokens)
        ]
        for dst, src in zip(moved, (self.chosen, self.top_values, self.top_tokens), strict=True):
            dst.copy_(src, non_blocking=pin)
        return LogprobRows(self.rows, *moved)

    def dicts(self, tokens: list[int | None], top: list[int]) -> dict[int, dict[int, float]]:
        """Read on the host: row -> {token: logprob} of its top[row] tokens and the one it emitted."""
        chosen, values, ids = self.chosen.tolist(), self.top_values.tolist(), self.top_tokens.tolist()
        found = {}
        for i, row in enumerate(self.rows):
            if tokens[row] is None:
                continue
            k = top[row]
            best = dict(zip(ids[i][:k], values[i][:k], strict=True))
            best[tokens[row]] = chosen[i]
            found[row] = best
        return found


def sample(logits: torch.Tensor, seqs: list[Sequence], *, backend: str | None = None) -> Sampled:
    """logits: [B, V], one row per sequence -> the next token of each (and its logprobs if asked for),
    read on the host. Penalties apply here (from the tokens the host knows); the draw is sample_rows'."""
    finite = None  # which rows were finite before penalties and grammars (which take tokens to -inf)
    penalized = [row for row, s in enumerate(seqs) if s.params.penalized]
    constrained = any(s.grammar is not None for s in seqs)
    if penalized or constrained:
        finite = torch.isfinite(logits).all(dim=-1)
    if penalized:
        ok = finite.tolist()
        logits = logits.float().clone()
        for row in penalized:
            if ok[row]:
                apply_penalties(logits[row], seqs[row])
    if constrained:  # (in place: the forward's logits are read by this draw only)
        mask_disallowed(logits, seqs)
    rows = SamplingRows.of(seqs, [len(s.output_token_ids) for s in seqs])
    drawn, lps = sample_rows(logits, rows, backend=backend, finite=finite)
    return read_sampled(drawn, lps, rows)


def read_sampled(drawn: torch.Tensor, lps: LogprobRows | None, rows: SamplingRows) -> Sampled:
    """sample_rows' results, read on the host (one copy of the tokens; one of the logprobs if asked)."""
    tokens, status = drawn.tolist()
    errors = [None if s == 1 else NON_FINITE if s == 0 else SAMPLING_FAILED for s in status]
    out: list[int | None] = [t if e is None else None for t, e in zip(tokens, errors, strict=True)]
    found = {} if lps is None else lps.dicts(out, rows.logprobs)
    return Sampled(out, [found.get(row) for row in range(len(out))], errors)


def sample_rows(
    logits: torch.Tensor,
    rows: SamplingRows,
    *,
    backend: str | None = None,
    finite: torch.Tensor | None = None,
    key_lag: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LogprobRows | None]:
    """Every row's token, on the device and without reading anything back: [2, R] int64, the token and
    the row's status (1: sampled; 0: its logits were not finite; -1: nothing to draw), and the logprobs of
    the rows that asked. logits [R, V]; finite [R] bool: which rows' logits were finite before penalties
    (computed here when None); key_lag [R] int64: which of rows.lagged_keys each row draws with.

    Every row's argmax and finiteness come from one batched launch (atom-kernels' greedy_tokens); sampled
    rows are then drawn in place with their keys (keyed_draw), their parameters in one copy."""
    out = greedy_tokens(logits, backend=backend)
    if finite is not None:
        out[1] = finite.long()
    if rows.plain_greedy:
        return out, None
    sampled = [row for row, t in enumerate(rows.temperatures) if t > 0]
    if sampled:
        vocab = logits.shape[1]
        # each sampled row's parameters in one copy: its logits row, top-k and key, then the floats' bits
        lagged = key_lag is not None and bool(rows.lagged_keys)
        keys = [rows.lagged_keys[r] for r in sampled] if lagged else [[rows.keys[r]] for r in sampled]
        ints = torch.tensor(
            [
                sampled,
                [rows.top_ks[r] for r in sampled],
                *([as_signed(k) for k in column] for column in zip(*keys, strict=True)),
            ]
        )
        floats = torch.tensor(
            [[f[r] for r in sampled] for f in (rows.temperatures, rows.top_ps, rows.min_ps)],
            dtype=torch.float64,
        )
        p = host_to_device(torch.cat([ints, floats.view(torch.int64)]), logits.device)
        width = len(keys[0])
        # (the kernels read the float64 parameters as float32 themselves: no conversion launched)
        temperature, top_p, min_p = p[2 + width :].view(torch.float64)
        lag = None
        if lagged:  # each row draws with its key at its sequence's true output position
            lag = key_lag if len(sampled) == len(rows.keys) else key_lag[p[0]]  # (all rows: in order)
        keyed_draw(
            logits,
            p[0],
            temperature,
            p[1],
            top_p,
            min_p,
            p[2 : 2 + width] if lagged else p[2],
            out,
            key_lag=lag,
            # which filters any row uses, known on the host (a device tensor's truth would wait for it)
            top_k_max=max((k for k in (rows.top_ks[r] for r in sampled) if 0 < k < vocab), default=0),
            top_p_used=any(rows.top_ps[r] < 1 for r in sampled),
            backend=backend,
        )
    wanted = [row for row, k in enumerate(rows.logprobs) if k >= 0]
    lps = _logprobs(logits.float(), out[0], wanted, max(rows.logprobs[r] for r in wanted)) if wanted else None
    return out, lps


def _logprobs(x: torch.Tensor, tokens: torch.Tensor, rows: list[int], k: int) -> LogprobRows:
    """Floored at LOGPROB_FLOOR, as vLLM's OpenAI server does: a token a penalty or mask took to -inf (a
    tiny repetition penalty leaves most of the row there) is -inf here, and JSON has no -inf. NaN too: a
    row is read only when its logits were finite and a token was drawn, but no value that JSON cannot
    carry may leave the engine."""
    at = to_device(rows, torch.long, x.device)
    lp = torch.log_softmax(x[at], dim=-1).nan_to_num_(nan=LOGPROB_FLOOR).clamp_(min=LOGPROB_FLOOR)
    chosen = lp.gather(1, tokens[at].clamp(0, lp.shape[1] - 1)[:, None])[:, 0]
    top = lp.topk(k, dim=-1)
    return LogprobRows(rows, chosen, top.values, top.indices)


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: list[int]) -> list[dict[int, float]]:
    """logits [R, V] -> per row, {token: logprob} for its top[row] most likely tokens and the one it emitted."""
    x = logits.float()
    rows = list(range(len(tokens)))
    lps = _logprobs(x, torch.tensor(tokens, dtype=torch.long, device=x.device), rows, max(top))
    found = lps.dicts(list(tokens), list(top))
    return [found[row] for row in rows]


NON_FINITE = "the model produced non-finite logits (NaN or Inf)"
SAMPLING_FAILED = "sampling failed: no token had a valid probability"
LOGPROB_FLOOR = -9999.0  # vLLM's: the least logprob a response carries


def sample_token(x: torch.Tensor, seq: Sequence, position: int) -> int:
    """seq's token at output position `position` from one row of logits [V], as sample_rows draws it
    (raises RuntimeError when the row has nothing to draw)."""
    drawn, _ = sample_rows(x[None], SamplingRows.of([seq], [position]))
    token, status = drawn[:, 0].tolist()
    if status != 1:
        raise RuntimeError(SAMPLING_FAILED if status < 0 else NON_FINITE)
    return token


def draw_key(seq: Sequence, position: int) -> int:
    """The 64-bit key of seq's draw at output position `position`: a function of (seq's seed, its sample
    index, position) and nothing else. Its top 53 bits are the draw's first uniform (keyed_draw_ref). The
    part without the position is kept on seq (draw_base): a step draws a row per sampled token."""
    base = seq.draw_base
    if base is None:
        base = seq.draw_base = splitmix64(splitmix64(seq.sample_seed) ^ seq.index)
    return splitmix64(base ^ position)
