"""atom-core's gdn_step over each way engines keep a GDN layer's states: every view of a verify step gives
the outputs, and keeps the per-token states, that the same tokens decoded one at a time through plain slots
give; a window in a wider, transposed conv buffer is read and written back like a contiguous one."""

import pytest
import torch

from atom_core.attention.gdn import GDNLayerSpec
from atom_core.attention.gdn_step import GDNBlockVerify, GDNScratchVerify, GDNStates, GDNStepView, gdn_step

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPEC = GDNLayerSpec(
    layer_index=0,
    num_k_heads=2,
    num_v_heads=4,
    head_k_dim=16,
    head_v_dim=24,
    conv_width=4,
    state_dtype=torch.float32,
    prefix="layers.0.linear_attn.core",
)
SEQS, TOKENS = 3, 3  # three sequences verifying two drafts each (k = 2)


def _inputs(tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE)

    mixed, b, a = rand(tokens, SPEC.conv_dim), rand(tokens, SPEC.num_v_heads), rand(tokens, SPEC.num_v_heads)
    weights = (
        rand(SPEC.conv_dim, SPEC.conv_width, scale=0.5),
        rand(SPEC.num_v_heads),
        rand(SPEC.num_v_heads),
    )
    return mixed, b, a, weights


def _states(slots: int, seed: int, conv_width: int | None = None) -> GDNStates:
    g = torch.Generator().manual_seed(seed)
    conv = torch.randn(slots, SPEC.conv_dim, conv_width or SPEC.conv_width - 1, generator=g)
    rec = torch.randn(slots, SPEC.num_v_heads, SPEC.head_v_dim, SPEC.head_k_dim, generator=g) * 0.1
    return GDNStates(conv.to(DEVICE), rec.to(DEVICE))


def _ints(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _one_at_a_time(mixed, b, a, weights, start: GDNStates):
    """The reference: each sequence's tokens decoded one by one from its slot i; returns the outputs and
    the (conv, recurrent) states after every token, [SEQS, TOKENS, ...]."""
    states = GDNStates(start.conv.clone(), start.recurrent.clone())
    outs, convs, recs = [], [], []
    cu, slots = _ints(list(range(SEQS + 1))), _ints(list(range(SEQS)))
    for t in range(TOKENS):
        rows = torch.arange(SEQS, device=DEVICE) * TOKENS + t
        view = GDNStepView(cu, slots, None, 1)
        outs.append(gdn_step(SPEC, mixed[rows], b[rows], a[rows], *weights, states, view))
        convs.append(states.conv.clone())
        recs.append(states.recurrent.clone())
    out = torch.stack(outs, 1).reshape(SEQS * TOKENS, SPEC.num_v_heads, SPEC.head_v_dim)
    return out, torch.stack(convs, 1), torch.stack(recs, 1)


def test_a_verify_into_step_slots_keeps_each_tokens_state():
    mixed, b, a, weights = _inputs(SEQS * TOKENS, 0)
    start = _states(SEQS, 1)
    want, convs, recs = _one_at_a_time(mixed, b, a, weights, start)
    states = _states(SEQS + SEQS * TOKENS, 1)  # slots 0..SEQS-1 as start, then one per token
    states.conv[:SEQS], states.recurrent[:SEQS] = start.conv, start.recurrent
    cu = _ints([i * TOKENS for i in range(SEQS + 1)])
    steps = _ints(list(range(SEQS, SEQS + SEQS * TOKENS)))
    view = GDNStepView(cu, _ints(list(range(SEQS))), None, TOKENS, steps)
    got = gdn_step(SPEC, mixed, b, a, *weights, states, view)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states.conv[SEQS:].view_as(convs), convs)
    torch.testing.assert_close(states.recurrent[SEQS:].view_as(recs), recs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        states.recurrent[:SEQS], start.recurrent
    )  # the sequences' own slots: untouched


def test_a_verify_into_scratch_leaves_the_sequences_states_alone():
    mixed, b, a, weights = _inputs(SEQS * TOKENS, 0)
    start = _states(SEQS + 1, 1)  # slot i + 1 is sequence i's; padding row -1 added at the end
    want, convs, recs = _one_at_a_time(mixed, b, a, weights, GDNStates(start.conv[1:], start.recurrent[1:]))
    states = GDNStates(start.conv.clone(), start.recurrent.clone())
    scratch = GDNStates(
        torch.full((SEQS + 1, TOKENS + 1, *start.conv.shape[1:]), float("nan"), device=DEVICE),
        torch.full((SEQS + 1, TOKENS + 1, *start.recurrent.shape[1:]), float("nan"), device=DEVICE),
    )
    pad = torch.zeros(TOKENS, *mixed.shape[1:], device=DEVICE)
    rows = lambda x: torch.cat([x, torch.zeros(TOKENS, *x.shape[1:], device=DEVICE)])  # noqa: E731
    view = GDNScratchVerify(_ints([1, 2, 3, -1]), TOKENS, scratch)
    got = gdn_step(SPEC, torch.cat([mixed, pad]), rows(b), rows(a), *weights, states, view)
    torch.testing.assert_close(got[: SEQS * TOKENS], want, rtol=1e-4, atol=1e-4)
    assert not got[SEQS * TOKENS :].any()  # the padding sequence's rows
    torch.testing.assert_close(scratch.conv[:SEQS, :TOKENS], convs)
    torch.testing.assert_close(scratch.recurrent[:SEQS, :TOKENS], recs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states.conv, start.conv)
    torch.testing.assert_close(states.recurrent, start.recurrent)


@pytest.mark.parametrize("accepted", [1, 2, 3])
def test_a_verify_over_draft_blocks_resumes_from_the_accepted_one_and_rolls_the_conv_window(accepted):
    """Step one verifies from block accepted - 1 of the step before; step two's window (at column
    accepted' - 1 of the rolled buffer) is the state after the accepted' tokens of step one."""
    k = TOKENS - 1
    mixed, b, a, weights = _inputs(SEQS * TOKENS, 0)
    start = _states(SEQS, 1)
    want, convs, recs = _one_at_a_time(mixed, b, a, weights, start)
    blocks = torch.arange(SEQS * (k + 1), device=DEVICE).view(SEQS, k + 1).flip(1).contiguous()  # any order
    width = SPEC.conv_width - 1 + k
    # vLLM's CPU orientation: [blocks, columns, conv_dim] storage, seen as [blocks, conv_dim, columns]
    buffer = torch.randn(SEQS * (k + 1), width, SPEC.conv_dim, device=DEVICE)
    states = GDNStates(buffer.transpose(1, 2), _states(SEQS * (k + 1), 2).recurrent)
    for i in range(SEQS):  # the step before accepted `accepted` tokens: its window starts there
        states.conv[blocks[i, 0], :, accepted - 1 : accepted - 1 + SPEC.conv_width - 1] = start.conv[i]
        states.recurrent[blocks[i, accepted - 1]] = start.recurrent[i]
    cu = _ints([i * TOKENS for i in range(SEQS + 1)])
    view = GDNBlockVerify(cu, blocks.to(torch.int32), _ints([accepted] * SEQS))
    got = gdn_step(SPEC, mixed, b, a, *weights, states, view)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for t in range(TOKENS):
        torch.testing.assert_close(states.recurrent[blocks[:, t]], recs[:, t], rtol=1e-4, atol=1e-4)
        window = states.conv[blocks[:, 0], :, t : t + SPEC.conv_width - 1]  # after accepting t + 1 tokens
        torch.testing.assert_close(window, convs[:, t])


def test_a_conv_window_inside_a_wider_transposed_buffer_is_read_and_written_back():
    mixed, b, a, weights = _inputs(7, 0)
    cu, slots, started = (
        _ints([0, 4, 5, 7]),
        _ints([2, 0, 1]),
        torch.tensor([True, False, True], device=DEVICE),
    )
    flat = _states(3, 1)
    wide = torch.randn(3, SPEC.conv_width + 1, SPEC.conv_dim, device=DEVICE)  # two extra columns
    wide[:, : SPEC.conv_width - 1] = flat.conv.transpose(1, 2)
    strided = GDNStates(wide.transpose(1, 2), flat.recurrent.clone())
    extra = wide[:, SPEC.conv_width - 1 :].clone()
    want = gdn_step(SPEC, mixed, b, a, *weights, flat, GDNStepView(cu, slots, started, 4))
    got = gdn_step(SPEC, mixed, b, a, *weights, strided, GDNStepView(cu, slots, started, 4))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(strided.conv[:, :, : SPEC.conv_width - 1], flat.conv)
    torch.testing.assert_close(strided.recurrent, flat.recurrent)
    torch.testing.assert_close(wide[:, SPEC.conv_width - 1 :], extra)  # columns past the window untouched


def test_an_unknown_view_is_refused():
    mixed, b, a, weights = _inputs(1, 0)
    with pytest.raises(TypeError, match="unknown view"):
        gdn_step(SPEC, mixed, b, a, *weights, _states(1, 1), object())
