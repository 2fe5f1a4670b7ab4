"""Speculative verify: the gated delta rule and the conv keep the state after every token (step slots), so
the engine can commit the accepted draft position. Each step state must equal the state of a run over
only the tokens up to it, in the reference and in the Triton kernels."""

import pytest
import torch

from atom_kernels.gdn import causal_conv1d, gated_delta_rule_recurrent

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DK, DV = (128, 128) if GPU else (32, 64)
LENGTHS = [3, 1, 2]  # 1 + drafts per sequence
OWN = [4, 0, 7]  # each sequence's slot; its first token's state goes back into it (in place)
# each token's step slot: the sequence's own for token 0, spare slots after; -1: a state kept nowhere
STEPS = [4, 1, 2, 0, 7, -1]


def _cu(lengths):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu.to(DEVICE)


def _ids(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _prefix_states(run, state):
    """The state each token's step slot must hold: a run over the sequence's tokens up to it."""
    want = {}
    starts = _cu(LENGTHS).tolist()
    for s, own in enumerate(OWN):
        for t in range(LENGTHS[s]):
            step = STEPS[starts[s] + t]
            if step < 0:
                continue
            scratch = state.clone()
            run((starts[s], starts[s] + t + 1), scratch, own)
            want[step] = scratch[own]
    return want


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rule_keeps_every_token_state(backend):
    hk, hv, tokens = 2, 4, sum(LENGTHS)
    q, k = (torch.randn(tokens, hk, DK, device=DEVICE) for _ in range(2))
    v = torch.randn(tokens, hv, DV, device=DEVICE)
    g, beta = -torch.rand(tokens, hv, device=DEVICE) * 0.3, torch.rand(tokens, hv, device=DEVICE)
    state = torch.randn(8, hv, DV, DK, device=DEVICE) * 0.1
    before = state.clone()

    def run(rows, scratch, own):
        a, b = rows
        gated_delta_rule_recurrent(
            q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], _cu([b - a]), scratch, _ids([own]), backend="torch"
        )

    want = _prefix_states(run, before)
    plain = gated_delta_rule_recurrent(
        q, k, v, g, beta, _cu(LENGTHS), before.clone(), _ids(OWN), backend="torch"
    )
    got = gated_delta_rule_recurrent(
        q, k, v, g, beta, _cu(LENGTHS), state, _ids(OWN), step_state_indices=_ids(STEPS), backend=backend
    )
    torch.testing.assert_close(got, plain, rtol=1e-4, atol=1e-4)  # outputs as without step states
    for slot, expected in want.items():
        torch.testing.assert_close(state[slot], expected, rtol=1e-4, atol=1e-4)
    for untouched in set(range(8)) - set(want):
        torch.testing.assert_close(state[untouched], before[untouched], rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_conv_keeps_every_token_window(backend):
    dim, width, tokens = 40, 4, sum(LENGTHS)
    x = torch.randn(tokens, dim, device=DEVICE)
    weight, bias = torch.randn(dim, width, device=DEVICE), torch.randn(dim, device=DEVICE)
    state = torch.randn(8, dim, width - 1, device=DEVICE)
    before = state.clone()

    def run(rows, scratch, own):
        a, b = rows
        causal_conv1d(x[a:b], weight, bias, _cu([b - a]), scratch, _ids([own]), backend="torch")

    want = _prefix_states(run, before)
    plain = causal_conv1d(x, weight, bias, _cu(LENGTHS), before.clone(), _ids(OWN), backend="torch")
    got = causal_conv1d(
        x,
        weight,
        bias,
        _cu(LENGTHS),
        state,
        _ids(OWN),
        max_seqlen=max(LENGTHS),
        step_state_indices=_ids(STEPS),
        backend=backend,
    )
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-5)
    for slot, expected in want.items():
        torch.testing.assert_close(state[slot], expected, rtol=1e-5, atol=1e-5)
    for untouched in set(range(8)) - set(want):
        torch.testing.assert_close(state[untouched], before[untouched], rtol=0, atol=0)


def test_step_slots_must_cover_every_token():
    x = torch.randn(6, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"step_state_indices must be \[T\] = \[6\]"):
        causal_conv1d(
            x,
            torch.randn(8, 4, device=DEVICE),
            None,
            _cu(LENGTHS),
            torch.zeros(8, 8, 3, device=DEVICE),
            _ids(OWN),
            step_state_indices=_ids([0, 1]),
        )
