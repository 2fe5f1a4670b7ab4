"""Sampled tokens drawn on the device without a sort: keyed_draw_ref's draw (top-k, top-p, min-p,
temperature, a 64-bit key per row) in a few short launches.

A sort of the whole vocabulary for top-p, and a float64 CDF over it, cost milliseconds a step at 64 rows;
the rejection draw of keyed_draw_ref needs only sums and one scan of one chunk a round. Each row is cut
into CHUNK-entry chunks, one program per (row, chunk), so a row is read by many SMs at once:

1. `_chunk_max`: each chunk's largest logit (the row's max is their max), and the row's round state;
2. `_chunk_mass`: each chunk's kept weight above the row's pivot (round 0: all of it);
3. `_check_draw` (one program a row): from the chunks' masses, the check of the last round's draw (the
   mass above it against top-p) and, if it is rejected, this round's draw: the chunk where the CDF passes
   the target, then a scan of that chunk. A rejected draw's masses above it are exactly the next round's
   candidates' masses, so a round is one `_chunk_mass` and one `_check_draw`.

Round 0, then SPREAD_ROUNDS more rounds, run this way (when any row uses top-p); `_finish` then runs the
rounds a row still needs in one program, reading the row in chunks (rare: a round rejects with the
probability of the mass outside the top-p set). Rows that are done mask their loads, so a round costs
them no reads. Nothing is read back to the host: the launches are the same whatever the draws.

The kernels sum fp32 weights (per chunk, then across chunks in float64); the reference sums in float64,
so a draw whose uniform falls within rounding of a CDF boundary may differ (keyed_draw_ref's
fragile_within finds those rows).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from atom_kernels.sampling.keyed_draw_ref import keyed_draw_ref, kth_logits
from atom_kernels.settings import Backend, resolve_backend

CHUNK = 4096  # vocabulary entries a program reads (32 programs a row for a 128k vocabulary)
SPREAD_ROUNDS = 3  # top-p rounds after round 0 run over many programs; the rest in _finish
_LOG2E = 1.4426950408889634


@triton.jit
def _splitmix64(x):
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _uniform(key, r):
    """keyed_draw_ref.uniform_of: round r's uniform (float64) of a row's uint64 key."""
    mixed = tl.where(r == 0, key, _splitmix64(key + r.to(tl.uint64)))
    return (mixed >> 11).to(tl.float64) * 1.1102230246251565e-16  # 2^-53


class DrawnRows(NamedTuple):
    """logits [R, V] and the rows drawn from it, rows [S] int64, read CHUNK entries a program."""

    logits: torch.Tensor
    rows: torch.Tensor
    stride: int
    vocab: int
    chunks: int


class RowParams(NamedTuple):
    """Each drawn row's sampling parameters [S] and its key (key_table [S], or [W, S] picked by lag [S]).

    Kernels take it as `per_row`: Triton's launcher binds a kernel's arguments in a generated function
    whose own local `params` would shadow an argument of that name."""

    temperature: torch.Tensor
    kth: torch.Tensor  # the k-th logit (unread without USE_KTH)
    min_p: torch.Tensor
    top_p: torch.Tensor
    key_table: torch.Tensor
    lag: torch.Tensor  # unread without HAS_LAG
    num_rows: int


class RoundState(NamedTuple):
    """Each row's rejection-draw state: pivot weight, done flag, round, round 0's total mass, and its
    chunks' maxima and masses [S * chunks]."""

    pivot: torch.Tensor
    done: torch.Tensor
    round: torch.Tensor
    total0: torch.Tensor
    part_max: torch.Tensor
    part_mass: torch.Tensor


@triton.jit
def _weights(src, row, cols, live, peak, scale, kth, min_p, pivot):
    """The candidates' weights at cols: exp((x - peak) / T) where the token is kept and above the pivot,
    else 0 (and 0 without a read where the row is done)."""
    x = tl.load(src.logits + row * src.stride + cols, mask=(cols < src.vocab) & live, other=float("-inf"))
    x = x.to(tl.float32)
    e = tl.exp2((x - peak) * scale)
    keep = (x >= kth) & (e >= min_p) & (e > pivot)
    return tl.where(keep, e, 0.0)


@triton.jit
def _row_params(s, src, per_row, state, BLOCK_C: tl.constexpr, USE_KTH: tl.constexpr):
    """Row s's logits row, its max (from its chunks' maxima), log2(e) / T, k-th logit (-inf without
    top-k) and min-p. The float parameters are read as fp32 whether passed as fp32 or fp64."""
    row = tl.load(src.rows + s).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    maxima = tl.load(state.part_max + s * src.chunks + c, mask=c < src.chunks, other=float("-inf"))
    peak = tl.max(maxima, axis=0)
    scale = 1.4426950408889634 / tl.load(per_row.temperature + s).to(tl.float32)
    kth = float("-inf")
    if USE_KTH:
        kth = tl.load(per_row.kth + s)
    return row, peak, scale, kth, tl.load(per_row.min_p + s).to(tl.float32)


@triton.jit
def _key(per_row, s, HAS_LAG: tl.constexpr):
    """Row s's uint64 key: keys[s], or with lags keys[lag[s], s] (keys [W, count])."""
    at = s.to(tl.int64)
    if HAS_LAG:
        at += tl.load(per_row.lag + s) * per_row.num_rows
    return tl.load(per_row.key_table + at).to(tl.uint64, bitcast=True)


@triton.jit
def _chunk_max(src, state, CHUNK: tl.constexpr):
    s, chunk = tl.program_id(0), tl.program_id(1)
    row = tl.load(src.rows + s).to(tl.int64)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(src.logits + row * src.stride + cols, mask=cols < src.vocab, other=float("-inf"))
    tl.store(state.part_max + s * src.chunks + chunk, tl.max(x.to(tl.float32), axis=0))
    if chunk == 0:  # the row's round state starts here (no launch of its own to zero it)
        tl.store(state.pivot + s, 0.0)
        tl.store(state.done + s, 0)
        tl.store(state.round + s, 0)


@triton.jit
def _chunk_mass(src, per_row, state, CHUNK: tl.constexpr, BLOCK_C: tl.constexpr, USE_KTH: tl.constexpr):
    s, chunk = tl.program_id(0), tl.program_id(1)
    row, peak, scale, kth, min_p = _row_params(s, src, per_row, state, BLOCK_C, USE_KTH)
    live = tl.load(state.done + s) == 0
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    e = _weights(src, row, cols, live, peak, scale, kth, min_p, tl.load(state.pivot + s))
    tl.store(state.part_mass + s * src.chunks + chunk, tl.sum(e, axis=0))


@triton.jit
def _check_draw(
    src,
    per_row,
    state,
    out_ptr,
    out_rows,
    FIRST: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_C: tl.constexpr,
    USE_KTH: tl.constexpr,
    HAS_LAG: tl.constexpr,
):
    """src: DrawnRows; per_row: RowParams; state: RoundState; out [2, R] (rows out_rows apart)."""
    s = tl.program_id(0)
    row, peak, scale, kth, min_p = _row_params(s, src, per_row, state, BLOCK_C, USE_KTH)
    c = tl.arange(0, BLOCK_C)
    masses = tl.load(state.part_mass + s * src.chunks + c, mask=c < src.chunks, other=0.0).to(tl.float64)
    total = tl.sum(masses, axis=0)
    top_p = tl.load(per_row.top_p + s).to(tl.float32)
    if FIRST:
        drew = (total > 0) & (total < float("inf"))
        tl.store(state.total0 + s, total)
        # status: 0 stays (the row's logits were not finite: greedy_tokens' check), else drew or not
        status = tl.load(out_ptr + out_rows + row)
        tl.store(out_ptr + out_rows + row, tl.where(status == 0, 0, tl.where(drew, 1, -1)))
        done = tl.where(drew, 0, 1)
        r = tl.zeros([], dtype=tl.int32)
    else:
        done = tl.load(state.done + s)
        accepted = total <= top_p.to(tl.float64) * tl.load(state.total0 + s)
        done = tl.where(accepted, 1, done)
        r = tl.load(state.round + s)
    live = done == 0
    pivot = tl.load(state.pivot + s)
    target = _uniform(_key(per_row, s, HAS_LAG), r) * total
    # the chunk where the CDF passes the target (the last with mass if rounding overshot them all)
    passed = tl.cumsum(masses, axis=0) > target
    chunk = tl.min(tl.where(passed & (masses > 0), c, BLOCK_C), axis=0)
    chunk = tl.where(chunk == BLOCK_C, tl.max(tl.where(masses > 0, c, -1), axis=0), chunk)
    chunk = tl.maximum(chunk, 0)
    before = tl.sum(tl.where(c < chunk, masses, 0.0), axis=0)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    e = _weights(src, row, cols, live, peak, scale, kth, min_p, pivot)
    token, weight = _scan_pick(e, cols, (target - before).to(tl.float32))
    if live:
        tl.store(out_ptr + row, token.to(tl.int64))
        tl.store(state.pivot + s, weight)
        tl.store(state.round + s, r + 1)
    # without top-p nothing is checked: the draw stands
    tl.store(state.done + s, tl.where(live & (top_p < 1), 0, 1))


@triton.jit
def _scan_pick(e, cols, target):
    """The first candidate of e (at cols) whose running sum passes target, else the last candidate
    (rounding), and its weight."""
    passed = (tl.cumsum(e, axis=0) > target) & (e > 0)
    big = 2**31 - 1
    first = tl.min(tl.where(passed, cols, big), axis=0)
    last = tl.max(tl.where(e > 0, cols, -1), axis=0)
    token = tl.where(first == big, last, first)
    token = tl.maximum(token, 0)
    return token, tl.sum(tl.where(cols == token, e, 0.0), axis=0)


@triton.jit
def _finish(
    src,
    per_row,
    state,
    out_ptr,
    CHUNK: tl.constexpr,
    BLOCK_C: tl.constexpr,
    USE_KTH: tl.constexpr,
    HAS_LAG: tl.constexpr,
):
    """The rounds a row still needs after the spread ones, in one program: check the last draw against
    the mass above it; if rejected, draw again over the whole row (read in chunks)."""
    s = tl.program_id(0)
    row, peak, scale, kth, min_p = _row_params(s, src, per_row, state, BLOCK_C, USE_KTH)
    done = tl.load(state.done + s)
    bound = tl.load(per_row.top_p + s).to(tl.float32).to(tl.float64) * tl.load(state.total0 + s)
    key = _key(per_row, s, HAS_LAG)
    r = tl.load(state.round + s)
    pivot = tl.load(state.pivot + s)
    token = tl.load(out_ptr + row).to(tl.int32)
    offs = tl.arange(0, CHUNK)
    going = tl.where(done == 0, 1, 0)
    # each rejected round removes at least its drawn token: vocab rounds bound it whatever rounding does
    while (going != 0) & (r < src.vocab + 2):
        total = tl.zeros([], dtype=tl.float64)
        for chunk in range(0, src.chunks):
            cols = chunk * CHUNK + offs
            e = _weights(src, row, cols, going != 0, peak, scale, kth, min_p, pivot)
            total += tl.sum(e, axis=0).to(tl.float64)
        going = tl.where(total > bound, 1, 0)
        if going != 0:
            target = _uniform(key, r) * total
            token, pivot = _draw_row(src, row, peak, scale, kth, min_p, pivot, target, CHUNK)
            r += 1
    tl.store(out_ptr + row, token.to(tl.int64))


@triton.jit
def _draw_row(src, row, peak, scale, kth, min_p, pivot, target, CHUNK: tl.constexpr):
    """The candidate (above pivot) where the row's CDF passes target, read in chunks, and its weight; the
    last candidate if rounding overshot them all."""
    offs = tl.arange(0, CHUNK)
    seen = tl.zeros([], dtype=tl.float64)
    found = tl.zeros([], dtype=tl.int32) - 1
    last = tl.zeros([], dtype=tl.int32) - 1
    weight = tl.zeros([], dtype=tl.float32)
    last_weight = tl.zeros([], dtype=tl.float32)
    for chunk in range(0, src.chunks):
        cols = chunk * CHUNK + offs
        e = _weights(src, row, cols, found < 0, peak, scale, kth, min_p, pivot)
        mass = tl.sum(e, axis=0).to(tl.float64)
        here = (found < 0) & (seen + mass > target)
        pick, pick_weight = _scan_pick(e, cols, (target - seen).to(tl.float32))
        found = tl.where(here, pick, found)
        weight = tl.where(here, pick_weight, weight)
        still = (mass > 0) & (found < 0)
        last_col = tl.max(tl.where(e > 0, cols, -1), axis=0)
        last = tl.where(still, last_col, last)
        last_weight = tl.where(still, tl.sum(tl.where(cols == last_col, e, 0.0), axis=0), last_weight)
        seen += mass
    return tl.where(found >= 0, found, last), tl.where(found >= 0, weight, last_weight)


def keyed_draw(
    logits: torch.Tensor,
    rows: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    keys: torch.Tensor,
    out: torch.Tensor,
    *,
    key_lag: torch.Tensor | None = None,
    top_k_max: int | None = None,
    top_p_used: bool = True,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Draw logits' rows `rows` as keyed_draw_ref does, into out.

    logits [R, V] (fp32 / fp16 / bf16; last dim contiguous); rows [S] int64: the rows drawn (the
    per-row parameters may be strided views, a broadcast lag too: they are made dense here); their
    temperature (> 0), top_p (in (0, 1]), min_p (in [0, 1]) [S] float32 or float64 (read as float32),
    top_k [S] int64 (<= 0: all) and keys [S] int64, or with key_lag [S] int64, keys [W, S]: row s draws
    with keys[key_lag[s], s]. out [2, R] int64 as greedy_tokens returns it (token; 1 where the row is
    finite, else 0): for each drawn row, out[0, row] becomes the drawn token and out[1, row] 1 if the row
    had anything to draw, -1 if not, 0 kept where its logits were not finite. top_k_max: the largest
    top_k of the rows below V, 0 when no row uses top-k (known on the host; None reads it from top_k, a
    device sync); top_p_used: whether any row's top_p is below 1 (False skips the top-p rounds). Returns
    out. The kernels need no host sync when top_k_max is given; the torch path (backend torch, fp64
    logits) runs keyed_draw_ref, the reference, which reads from the device every round."""
    if logits.dim() != 2 or out.shape != (2, logits.shape[0]) or not out.is_contiguous():
        raise ValueError(f"keyed_draw expects logits [R, V] and out [2, R], got {logits.shape}, {out.shape}")
    count, vocab = rows.shape[0], logits.shape[1]
    if count == 0:
        return out
    if key_lag is not None and (keys.dim() != 2 or keys.shape[1] != count):
        raise ValueError(f"keyed_draw with key_lag expects keys [W, {count}], got {tuple(keys.shape)}")
    chosen = resolve_backend(backend, logits.device)
    use_kernel = (
        chosen is not Backend.TORCH
        and (logits.is_cuda or backend is not None)
        and logits.stride(-1) == 1
        and logits.dtype in (torch.float32, torch.float16, torch.bfloat16)
    )
    if not use_kernel:  # (the reference finds each row's k-th logit itself)
        if key_lag is not None:
            keys = keys.gather(0, key_lag[None, :])[0]
        temperature, top_p, min_p = (t.float() for t in (temperature, top_p, min_p))
        tokens, drew = keyed_draw_ref(logits[rows], temperature, top_k, top_p, min_p, keys)
        out[0, rows] = tokens
        out[1, rows] = torch.where(out[1, rows] == 0, 0, torch.where(drew, 1, -1))
        return out
    device = logits.device
    chunks = triton.cdiv(vocab, CHUNK)
    block_c = triton.next_power_of_2(chunks)
    # (nothing here is zeroed by a launch of its own: _chunk_max starts each row's round state)
    state = RoundState(
        pivot=torch.empty(count, dtype=torch.float32, device=device),
        done=torch.empty(count, dtype=torch.int32, device=device),
        round=torch.empty(count, dtype=torch.int32, device=device),
        total0=torch.empty(count, dtype=torch.float64, device=device),
        part_max=torch.empty(count * chunks, dtype=torch.float32, device=device),
        part_mass=torch.empty(count * chunks, dtype=torch.float32, device=device),
    )
    temperature, top_p, min_p = (
        (t if t.dtype in (torch.float32, torch.float64) else t.float()).contiguous()
        for t in (temperature, top_p, min_p)
    )
    # the kernels index every parameter by row (keys by [W, S]): a strided view, such as one sequence's
    # lag broadcast over its rows (stride 0), is laid out densely first, or its rows past the first
    # would be read from whatever memory follows it
    rows, keys = rows.to(torch.int64).contiguous(), keys.to(torch.int64).contiguous()
    top_k = top_k.contiguous()
    kth = kth_logits(logits[rows], top_k, top_k_max) if top_k_max != 0 else None
    use_kth, has_lag = kth is not None, key_lag is not None
    lag = key_lag.to(torch.int64).contiguous() if has_lag else rows  # (not read without a lag)
    src = DrawnRows(logits, rows, logits.stride(0), vocab, chunks)
    per_row = RowParams(temperature, kth if use_kth else state.part_max, min_p, top_p, keys, lag, count)
    _chunk_max[(count, chunks)](src, state, CHUNK=CHUNK, num_warps=8)
    flags = dict(CHUNK=CHUNK, BLOCK_C=block_c, USE_KTH=use_kth, num_warps=8)
    for r in range(1 + (SPREAD_ROUNDS if top_p_used else 0)):
        _chunk_mass[(count, chunks)](src, per_row, state, **flags)
        _check_draw[(count,)](src, per_row, state, out, out.stride(0), FIRST=r == 0, HAS_LAG=has_lag, **flags)
    if top_p_used:
        _finish[(count,)](src, per_row, state, out, HAS_LAG=has_lag, **flags)
    return out
