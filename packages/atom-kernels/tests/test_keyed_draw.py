"""keyed_draw: the reference's law (an accepted draw is distributed as the normalised top-p set; without
top-p, round 0 is the inverse CDF at the key's uniform) and the kernels against the reference (CPU:
Triton's interpreter; GPU: the kernels)."""

import pytest
import torch

from atom_kernels.sampling import greedy_tokens, keyed_draw, keyed_draw_ref
from atom_kernels.sampling.keyed_draw import CHUNK, SPREAD_ROUNDS
from atom_kernels.sampling.keyed_draw_ref import as_signed, splitmix64, uniform_of

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def _keys(n: int, seed: int = 0) -> torch.Tensor:
    return torch.tensor([as_signed(splitmix64(seed * 1_000_003 + i)) for i in range(n)], dtype=torch.int64)


def _params(n, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0):
    full = lambda v, dt: torch.full((n,), v, dtype=dt)  # noqa: E731
    return (
        full(temperature, torch.float32),
        full(top_k, torch.int64),
        full(top_p, torch.float32),
        full(min_p, torch.float32),
    )


def _top_p_law(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The normalised top-p set of one row, computed with a sort (ties at the edge kept)."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    values, order = probs.sort(descending=True)
    # a token's mass strictly above it: ties share the mass before the first of them
    above = torch.zeros_like(probs)
    running = 0.0
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        above[order[i:j]] = running
        running += float(values[i:j].sum())
        i = j
    kept = torch.where(above <= top_p * probs.sum(), probs, 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 0.6), (0.7, 0.9), (1.5, 0.3)])
def test_the_reference_draws_the_normalised_top_p_set(temperature, top_p):
    logits = torch.randn(40, generator=torch.Generator().manual_seed(1)) * 1.5
    logits[7] = logits[3]  # a tie
    n = 4000
    tokens, drew = keyed_draw_ref(logits.repeat(n, 1), *_params(n, temperature, -1, top_p), _keys(n))
    assert drew.all()
    law = _top_p_law(logits, temperature, top_p)
    seen = torch.bincount(tokens, minlength=40).double() / n
    assert seen[law == 0].sum() == 0  # nothing outside the set
    assert (seen - law).abs().sum() / 2 < 0.04  # total variation (about 0.015 expected at n = 4000)


def test_without_top_p_round_zero_is_the_inverse_cdf_at_the_keys_uniform():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(2))
    keys = _keys(6, seed=3)
    tokens, _ = keyed_draw_ref(logits, *_params(6, 0.8), keys)
    probs = torch.softmax(logits.double() / 0.8, dim=-1)
    for row in range(6):
        u = uniform_of(keys[row].item() % 2**64, 0)
        want = int(torch.searchsorted(probs[row].cumsum(0), torch.tensor([u * probs[row].sum()]), right=True))
        assert tokens[row].item() == want


def test_top_k_and_min_p_keep_ties_and_the_peak():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 0.5]] * 200)
    n = logits.shape[0]
    for top_k, want in ((2, {1, 3}), (3, {1, 2, 3, 4}), (1, {1, 3})):
        tokens, _ = keyed_draw_ref(logits, *_params(n, 1.0, top_k), _keys(n))
        assert set(tokens.tolist()) == want
    tokens, _ = keyed_draw_ref(logits, *_params(n, 1.0, -1, 1.0, 1.0), _keys(n))
    assert set(tokens.tolist()) == {1, 3}  # min-p 1 keeps the most likely tokens alone


def test_uniforms_are_distinct_per_round_and_round_zero_is_the_key():
    key = 0xDEADBEEF12345678
    assert uniform_of(key, 0) == (key >> 11) * 2.0**-53
    assert len({uniform_of(key, r) for r in range(50)}) == 50


def _draw_both(logits, rows, params, keys, *, top_k_max=None, top_p_used=True):
    out = greedy_tokens(logits, backend="torch")
    got = keyed_draw(
        logits,
        rows,
        *params,
        keys,
        out.clone(),
        top_k_max=top_k_max,
        top_p_used=top_p_used,
        backend="triton",
    )
    want_tokens, want_drew, fragile = keyed_draw_ref(logits[rows], *params, keys, fragile_within=1e-5)
    return out, got, want_tokens, want_drew, fragile


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [77, 2 * CHUNK + 517])
def test_the_kernels_draw_what_the_reference_draws(vocab, dtype):
    gen = torch.Generator().manual_seed(vocab)
    count = 12
    logits = (torch.randn(count + 2, vocab, generator=gen) * 3).to(dtype).to(DEVICE)
    rows = torch.tensor([0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13], device=DEVICE)  # rows 1 and 12 greedy
    temperature = torch.tensor([0.5, 1.0, 0.8, 2.0, 1.0, 0.7, 1.0, 1.3, 0.9, 1.0, 0.6, 1.0])
    top_k = torch.tensor([-1, 5, -1, 40, -1, -1, 1, -1, 200, -1, 3, 0])
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.95, 0.5, 0.1, 1.0, 0.8, 0.99, 0.02, 0.7, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.3])
    params = tuple(t.to(DEVICE) for t in (temperature, top_k, top_p, min_p))
    keys = _keys(count, seed=vocab).to(DEVICE)
    out, got, want_tokens, want_drew, fragile = _draw_both(logits, rows, params, keys)
    assert fragile.sum() <= 1
    sure = ~fragile
    assert torch.equal(got[0, rows][sure], want_tokens[sure])
    assert torch.equal(got[1, rows], torch.where(want_drew, 1, -1))
    greedy = torch.tensor([1, 12], device=DEVICE)
    assert torch.equal(got[:, greedy], out[:, greedy])  # rows not drawn are left as they were
    # the same draw again (a CUDA graph replays launches on reused buffers)
    again = keyed_draw(logits, rows, *params, keys, out.clone(), top_k_max=200, backend="triton")
    assert torch.equal(again, got)


def test_rows_needing_many_rounds_are_finished_by_one_program():
    """top-p so small its set is the peak alone: each round halves the candidates on average, so draws
    take about log2(V) rounds, past the spread ones."""
    vocab = CHUNK + 900
    gen = torch.Generator().manual_seed(5)
    logits = (torch.rand(4, vocab, generator=gen) * 0.01).to(DEVICE)
    peaks = torch.tensor([17, CHUNK + 3, 2, vocab - 1])
    logits[torch.arange(4), peaks] = 0.02
    rows = torch.arange(4, device=DEVICE)
    params = tuple(t.to(DEVICE) for t in _params(4, 1.0, -1, 1e-6))
    _, got, want_tokens, _, _ = _draw_both(logits, rows, params, _keys(4, seed=9).to(DEVICE))
    assert got[0].tolist() == peaks.tolist() == want_tokens.tolist()
    assert SPREAD_ROUNDS < 10  # the test's premise: the spread rounds alone would not have got there


def test_non_finite_rows_keep_their_status_and_nothing_to_draw_says_so():
    logits = torch.randn(3, 300, device=DEVICE)
    logits[0, 5] = float("nan")
    rows = torch.arange(3, device=DEVICE)
    params = _params(3, 1.0, -1, 0.9)
    out = greedy_tokens(logits, backend="torch")
    got = keyed_draw(
        logits, rows, *(t.to(DEVICE) for t in params), _keys(3).to(DEVICE), out, backend="triton"
    )
    assert got[1].tolist() == [0, 1, 1]


def test_only_the_used_filters_run_and_without_them_the_draw_is_the_same():
    logits = torch.randn(5, 700, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    rows = torch.arange(5, device=DEVICE)
    params = tuple(t.to(DEVICE) for t in _params(5, 0.9))
    keys = _keys(5, seed=11).to(DEVICE)
    _, plain, want, _, fragile = _draw_both(logits, rows, params, keys, top_k_max=0, top_p_used=False)
    assert not fragile.any() and torch.equal(plain[0], want)
    _, full, _, _, _ = _draw_both(logits, rows, params, keys)
    assert torch.equal(full, plain)


def test_lagged_keys_and_float64_parameters_draw_as_their_picked_keys_and_float32_do():
    """The engine passes each row a window of keys and which one its lag picks (keys [W, S], key_lag
    [S]), and its float parameters as float64: the draw is that of the picked keys and float32."""
    count, width = 6, 3
    logits = torch.randn(count, 2 * CHUNK + 33, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    rows = torch.arange(count, device=DEVICE)
    temperature, top_k, top_p, min_p = (t.to(DEVICE) for t in _params(count, 0.8, -1, 0.9))
    window = _keys(count * width, seed=3).view(width, count).to(DEVICE)
    lag = torch.tensor([0, 2, 1, 1, 0, 2], device=DEVICE)
    picked = window.gather(0, lag[None, :])[0]
    out = greedy_tokens(logits, backend="torch")
    want = keyed_draw(logits, rows, temperature, top_k, top_p, min_p, picked, out.clone(), backend="triton")
    doubles = [t.double() for t in (temperature, top_p, min_p)]
    got = keyed_draw(
        logits, rows, doubles[0], top_k, *doubles[1:], window, out.clone(), key_lag=lag, backend="triton"
    )
    assert torch.equal(got, want)
    by_ref = keyed_draw(
        logits, rows, temperature, top_k, top_p, min_p, window, out.clone(), key_lag=lag, backend="torch"
    )
    _, _, fragile = keyed_draw_ref(logits, temperature, top_k, top_p, min_p, picked, fragile_within=1e-5)
    assert torch.equal(by_ref[0][~fragile], want[0][~fragile])
    with pytest.raises(ValueError, match=r"keys \[W, 6\]"):
        keyed_draw(logits, rows, temperature, top_k, top_p, min_p, picked, out, key_lag=lag)


def test_strided_parameters_and_a_broadcast_lag_draw_as_dense_ones():
    """One sequence's lag broadcast over its rows (stride 0, as the engine's row lag of a single
    sequence is) and parameters taken as strided views: the draw is the dense inputs'. Before they were
    made dense the kernels read the rows past the first from the memory after them (here: other lags)."""
    count, width = 3, 3
    logits = torch.randn(count, 2 * CHUNK + 33, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    window = _keys(count * width, seed=4).view(width, count).to(DEVICE)
    lags = torch.tensor([1, 2, 0, 2], device=DEVICE)  # what follows the first lag in memory differs from it
    broadcast = lags[:1].expand(count)
    assert broadcast.stride(0) == 0
    temperature, top_k, top_p, min_p = _params(2 * count, 0.7, -1, 0.9)
    strided = [t.to(DEVICE)[::2] for t in (temperature, top_k, top_p, min_p)]
    rows = torch.arange(2 * count, device=DEVICE)[::2] // 2
    out = greedy_tokens(logits, backend="torch")
    got = keyed_draw(logits, rows, *strided, window, out.clone(), key_lag=broadcast, backend="triton")
    dense = [t.contiguous() for t in strided]
    want = keyed_draw(
        logits,
        rows.contiguous(),
        *dense,
        window,
        out.clone(),
        key_lag=broadcast.contiguous(),
        backend="triton",
    )
    assert torch.equal(got, want)
    picked = window[1]  # every row's key at lag 1
    assert torch.equal(
        want, keyed_draw(logits, rows.contiguous(), *dense, picked, out.clone(), backend="triton")
    )


def test_bad_shapes_are_refused():
    logits = torch.randn(2, 10, device=DEVICE)
    with pytest.raises(ValueError, match="out \\[2, R\\]"):
        keyed_draw(logits, torch.arange(2), *_params(2), _keys(2), torch.zeros(2, 3, dtype=torch.int64))
