"""plan_chunks: the chunked delta rule's plan, made once and handed to each layer (plan=), against the
chunks counted on the host; a plan for other sequences is refused by name."""

import pytest
import torch

from atom_kernels.gdn import gated_delta_rule_chunked, plan_chunks
from atom_kernels.gdn.chunked import CHUNK

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DK, DV = 16, 32


def _cu(lengths):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu.to(DEVICE)


@pytest.mark.parametrize("lengths", [[1], [64], [65, 3], [0, 130, 64, 1]])
def test_plan_counts_every_sequences_chunks(lengths):
    plan = plan_chunks(_cu(lengths), sum(lengths))
    want_seq, want_start, first = [], [], [0]
    start = 0
    for s, n in enumerate(lengths):
        for c in range(0, n, CHUNK):
            want_seq.append(s)
            want_start.append(start + c)
        start += n
        first.append(len(want_seq))
    bound = sum(lengths) // CHUNK + len(lengths)  # the grid's bound: entries past the chunks are -1
    assert plan.chunk_seq.tolist() == want_seq + [-1] * (bound - len(want_seq))
    assert plan.chunk_start.tolist()[: len(want_start)] == want_start
    assert plan.first_chunk.tolist() == first


def _inputs(lengths, heads=2):
    tokens = sum(lengths)
    gen = torch.Generator().manual_seed(tokens)
    q, k = (torch.randn(tokens, 1, DK, generator=gen).to(DEVICE) for _ in range(2))
    v = torch.randn(tokens, heads, DV, generator=gen).to(DEVICE)
    g = (-torch.rand(tokens, heads, generator=gen) * 0.3).to(DEVICE)
    beta = torch.rand(tokens, heads, generator=gen).to(DEVICE)
    state = (torch.randn(len(lengths), heads, DV, DK, generator=gen) * 0.1).to(DEVICE)
    return q, k, v, g, beta, state


def test_a_given_plan_gives_what_the_layer_plans_itself():
    lengths = [70, 5]
    q, k, v, g, beta, state = _inputs(lengths)
    cu, slots = _cu(lengths), torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    own_state, given_state = state.clone(), state.clone()
    own = gated_delta_rule_chunked(q, k, v, g, beta, cu, own_state, slots, backend="triton")
    plan = plan_chunks(cu, sum(lengths))
    given = gated_delta_rule_chunked(q, k, v, g, beta, cu, given_state, slots, backend="triton", plan=plan)
    assert torch.equal(given, own) and torch.equal(given_state, own_state)
    # the kernels read the plan they are given: one of the same shape for [5, 70] splits these tokens
    # elsewhere, so the result moves
    other = plan_chunks(_cu(lengths[::-1]), sum(lengths))
    moved = gated_delta_rule_chunked(q, k, v, g, beta, cu, state.clone(), slots, backend="triton", plan=other)
    assert not torch.allclose(moved, own)


def test_a_plan_for_other_sequences_is_refused():
    q, k, v, g, beta, state = _inputs([70, 5])
    cu, slots = _cu([70, 5]), torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"plan is for 2 chunks and 1 sequences; .* need plan_chunks"):
        gated_delta_rule_chunked(
            q, k, v, g, beta, cu, state, slots, backend="triton", plan=plan_chunks(_cu([75]), 75)
        )
