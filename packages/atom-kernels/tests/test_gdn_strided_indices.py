"""The GDN kernels take their per-sequence index tensors as engines hand them: vLLM's state slots are
column 0 of its block table (stride = the table's width once speculative decoding adds state blocks), a
view the kernels must read by its stride, not as consecutive int32s (which named the first request's
other blocks as the second and third requests' slots, and dropped their final states)."""

import pytest
import torch

from atom_kernels.gdn import causal_conv1d, gated_delta_rule_chunked, gated_delta_rule_recurrent

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HK, HV, DK, DV = 2, 4, 16, 32
LENGTHS = [19, 33, 5]  # three prefills in one step, as vLLM schedules them


def _block_table_column(slots: list[int], width: int = 3) -> torch.Tensor:
    """[S] slot ids as column 0 of a [S, width] table whose other columns hold other slots."""
    table = torch.tensor([[s, s + 1, s + 2][:width] for s in slots], dtype=torch.int32, device=DEVICE)
    column = table[:, 0]
    assert column.stride(0) == width
    return column


def _cu() -> torch.Tensor:
    return torch.tensor([0, 19, 52, 57], dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("kernel", [gated_delta_rule_chunked, gated_delta_rule_recurrent])
def test_rules_read_strided_state_slots(kernel):
    torch.manual_seed(0)
    tokens = sum(LENGTHS)
    q, k = (torch.randn(tokens, HK, DK, device=DEVICE) for _ in range(2))
    v = torch.randn(tokens, HV, DV, device=DEVICE)
    g, beta = -torch.rand(tokens, HV, device=DEVICE) * 0.3, torch.rand(tokens, HV, device=DEVICE)
    slots = _block_table_column([1, 6, 11])
    started = torch.tensor([[True, False], [False, False], [True, True]], device=DEVICE)[:, 0]
    state = torch.randn(16, HV, DV, DK, device=DEVICE) * 0.1
    want_state = state.clone()
    want = gated_delta_rule_recurrent(
        q, k, v, g, beta, _cu(), want_state, slots.contiguous(), has_initial_state=started, backend="torch"
    )
    got = kernel(q, k, v, g, beta, _cu(), state, slots, has_initial_state=started, backend="triton")
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(state, want_state, rtol=2e-3, atol=2e-3)  # every slot, the others untouched


def test_verify_reads_strided_resume_and_step_slots():
    torch.manual_seed(1)
    tokens = 9
    q, k = (torch.randn(tokens, HK, DK, device=DEVICE) for _ in range(2))
    v = torch.randn(tokens, HV, DV, device=DEVICE)
    g, beta = -torch.rand(tokens, HV, device=DEVICE) * 0.3, torch.rand(tokens, HV, device=DEVICE)
    cu = torch.tensor([0, 3, 6, 9], dtype=torch.int32, device=DEVICE)
    resume = _block_table_column([1, 6, 11])
    # every token's state to its own slot, apart from the resume slots (programs run in parallel)
    steps = torch.arange(20, 38, dtype=torch.int32, device=DEVICE).view(9, 2)[:, 0]  # 20, 22, ..., 36
    state = torch.randn(40, HV, DV, DK, device=DEVICE) * 0.1
    want_state = state.clone()
    want = gated_delta_rule_recurrent(
        q,
        k,
        v,
        g,
        beta,
        cu,
        want_state,
        resume.contiguous(),
        step_state_indices=steps.contiguous(),
        backend="torch",
    )
    got = gated_delta_rule_recurrent(
        q, k, v, g, beta, cu, state, resume, step_state_indices=steps, backend="triton"
    )
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(state, want_state, rtol=2e-3, atol=2e-3)


def test_conv_reads_strided_state_slots():
    torch.manual_seed(2)
    dim, width = 40, 4
    x = torch.randn(sum(LENGTHS), dim, device=DEVICE)
    weight = torch.randn(dim, width, device=DEVICE)
    slots = _block_table_column([1, 6, 11])
    started = torch.tensor([[True, False], [False, False], [True, True]], device=DEVICE)[:, 0]
    state = torch.randn(16, dim, width - 1, device=DEVICE)
    want_state = state.clone()
    want = causal_conv1d(
        x, weight, None, _cu(), want_state, slots.contiguous(), has_initial_state=started, backend="torch"
    )
    got = causal_conv1d(x, weight, None, _cu(), state, slots, has_initial_state=started, backend="triton")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5)
