"""Snapshots: the gated delta rule and the conv keep a sequence's state partway through it (an engine's
prefix cache keeps the state at a block boundary inside a prefill chunk) in a slot of its own, and still
leave the final state in the sequence's slot. A kept state must equal the state of a run over only the
tokens up to it, and the outputs and final states must equal a run without snapshots, in the reference
and in the Triton kernels."""

import pytest
import torch

from atom_kernels.gdn import Snapshots, causal_conv1d, gated_delta_rule_chunked, plan_chunks
from atom_kernels.gdn.chunked import CHUNK, max_chunks

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DK, DV = (128, 128) if GPU else (16, 32)
# a snapshot inside a chunk, one at a chunk's end, none, one after the last token, one after the first
LENGTHS = [70, 130, 5, 3, 9]
OWN = [1, 0, 3, 2, 4]
KEPT = [5, 7, -1, 6, 8]
LENS = [68, 64, 0, 3, 1]
STARTED = [True, False, True, True, True]
SLOTS = 9


def _cu(lengths):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu.to(DEVICE)


def _ids(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _snapshots():
    return Snapshots(_ids(KEPT), _ids(LENS))


def _kept_states(run, state):
    """What each snapshot slot must hold: a run over the sequence's first lens[s] tokens."""
    starts = _cu(LENGTHS).tolist()
    want = {}
    for s, slot in enumerate(KEPT):
        if slot >= 0:
            scratch = state.clone()
            run(starts[s], starts[s] + LENS[s], scratch, OWN[s], STARTED[s])
            want[slot] = scratch[OWN[s]]
    return want


def test_the_plan_ends_a_chunk_at_each_snapshot():
    plan = plan_chunks(_cu(LENGTHS), sum(LENGTHS), _ids(LENS))
    want_start, want_end, first, kept = [], [], [0], []
    base = 0
    for length, n in zip(LENGTHS, LENS, strict=True):
        split = n if 1 <= n <= length else length
        for piece, (a, b) in enumerate(((0, split), (split, length))):
            for c in range(a, b, CHUNK):
                want_start.append(base + c)
                want_end.append(base + min(c + CHUNK, b))
            if piece == 0:  # the snapshot's chunk: the first piece's last
                kept.append(len(want_start) - 1 if split == n else -1)
        first.append(len(want_start))
        base += length
    bound = max_chunks(sum(LENGTHS), len(LENGTHS), snapshots=True)
    count = len(want_start)
    assert plan.chunk_seq.numel() == bound and (plan.chunk_seq[count:] == -1).all()
    assert plan.chunk_start.tolist()[:count] == want_start
    assert plan.chunk_end.tolist()[:count] == want_end
    assert plan.first_chunk.tolist() == first
    assert plan.snapshot_chunk.tolist() == kept
    plain = plan_chunks(_cu(LENGTHS), sum(LENGTHS))
    assert (plain.snapshot_chunk == -1).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rule_keeps_the_state_partway_through(backend):
    hk, hv, tokens = 2, 4, sum(LENGTHS)
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(tokens, hk, DK, generator=gen).to(DEVICE) for _ in range(2))
    v = torch.randn(tokens, hv, DV, generator=gen).to(DEVICE)
    g = (-torch.rand(tokens, hv, generator=gen) * 0.3).to(DEVICE)
    beta = torch.rand(tokens, hv, generator=gen).to(DEVICE)
    state = (torch.randn(SLOTS, hv, DV, DK, generator=gen) * 0.1).to(DEVICE)
    started = torch.tensor(STARTED, device=DEVICE)
    before = state.clone()

    def run(a, b, scratch, own, keep):
        gated_delta_rule_chunked(
            q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], _cu([b - a]), scratch, _ids([own]),
            has_initial_state=torch.tensor([keep], device=DEVICE), backend="torch",
        )  # fmt: skip

    want = _kept_states(run, before)
    plain_state = before.clone()
    plain = gated_delta_rule_chunked(
        q, k, v, g, beta, _cu(LENGTHS), plain_state, _ids(OWN), has_initial_state=started, backend="torch"
    )
    got = gated_delta_rule_chunked(
        q, k, v, g, beta, _cu(LENGTHS), state, _ids(OWN), has_initial_state=started, backend=backend,
        snapshots=_snapshots(),
    )  # fmt: skip
    tol = dict(rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(got, plain, **tol)  # outputs as without snapshots
    torch.testing.assert_close(state[OWN], plain_state[OWN], **tol)  # and the final states
    for slot, expected in want.items():
        torch.testing.assert_close(state[slot], expected, **tol)
    for untouched in set(range(SLOTS)) - set(want) - set(OWN):
        assert torch.equal(state[untouched], before[untouched])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_conv_keeps_the_window_partway_through(backend):
    dim, width, tokens = 40, 4, sum(LENGTHS)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, dim, generator=gen).to(DEVICE)
    weight, bias = (
        torch.randn(dim, width, generator=gen).to(DEVICE),
        torch.randn(dim, generator=gen).to(DEVICE),
    )
    state = torch.randn(SLOTS, dim, width - 1, generator=gen).to(DEVICE)
    started = torch.tensor(STARTED, device=DEVICE)
    before = state.clone()

    def run(a, b, scratch, own, keep):
        causal_conv1d(
            x[a:b], weight, bias, _cu([b - a]), scratch, _ids([own]),
            has_initial_state=torch.tensor([keep], device=DEVICE), backend="torch",
        )  # fmt: skip

    want = _kept_states(run, before)  # (lens 1 and 3 keep windows that reach into the old state)
    plain_state = before.clone()
    plain = causal_conv1d(
        x, weight, bias, _cu(LENGTHS), plain_state, _ids(OWN), has_initial_state=started, backend="torch"
    )
    got = causal_conv1d(
        x, weight, bias, _cu(LENGTHS), state, _ids(OWN), has_initial_state=started, backend=backend,
        snapshots=_snapshots(),
    )  # fmt: skip
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[OWN], plain_state[OWN], rtol=1e-5, atol=1e-5)
    for slot, expected in want.items():
        torch.testing.assert_close(state[slot], expected, rtol=1e-5, atol=1e-5)
    for untouched in set(range(SLOTS)) - set(want) - set(OWN):
        assert torch.equal(state[untouched], before[untouched])


def test_bad_snapshots_are_named():
    x, weight, state = torch.randn(6, 8), torch.randn(8, 4), torch.zeros(4, 8, 3)
    cu, own = torch.tensor([0, 6], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    one = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(ValueError, match="snapshots and step_state_indices cannot be combined"):
        causal_conv1d(
            x, weight, None, cu, state, own, step_state_indices=torch.zeros(6, dtype=torch.int32),
            snapshots=Snapshots(one, one),
        )  # fmt: skip
    with pytest.raises(
        ValueError, match=r"snapshot slots and lens must be \[S\] = \[1\], got \(2,\), \(1,\)"
    ):
        causal_conv1d(x, weight, None, cu, state, own, snapshots=Snapshots(torch.tensor([1, 2]), one))
    with pytest.raises(ValueError, match="sequence 0 of 6 tokens cannot keep the state after 7 of them"):
        causal_conv1d(
            x, weight, None, cu, state, own, snapshots=Snapshots(one, torch.tensor([7])), backend="torch"
        )
