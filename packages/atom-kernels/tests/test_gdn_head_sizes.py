"""Gated delta rule kernels at head sizes that are not powers of two (transformers accepts any): the
kernels hold each head padded to a power of two and mask the padding, so outputs and states equal the
torch reference, which has no padding; the cache slots' own entries alone are read and written."""

import pytest
import torch

from atom_kernels.gdn import (
    check_gdn_head_sizes,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    max_key_head_size,
)
from atom_kernels.gdn.inputs import padded_head_size

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# (Dk, Dv) in fp32: the interpreter runs small ones; the GPU wider ones too (fp32 keys up to 128)
SIZES = [(24, 16), (16, 40), (8, 24)] + ([(48, 96), (96, 48), (24, 24), (100, 200)] if GPU else [])
LOW = torch.bfloat16 if GPU else torch.float16


def _cu(lengths):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu.to(DEVICE)


def _inputs(lengths, hk, hv, dk, dv, dtype=torch.float32):
    tokens = sum(lengths)
    q = torch.randn(tokens, hk, dk, device=DEVICE).to(dtype)
    k = torch.randn(tokens, hk, dk, device=DEVICE).to(dtype)
    v = torch.randn(tokens, hv, dv, device=DEVICE).to(dtype)
    g = -torch.rand(tokens, hv, device=DEVICE) * 0.3
    beta = torch.rand(tokens, hv, device=DEVICE).to(dtype)
    return q, k, v, g, beta


def _slots(n, hv, dk, dv):
    """n + 2 state slots with NaN in every slot the kernels must not touch (so a read past a head's own
    entries, or of an unnamed slot, shows), the named ones random; returns (state, indices)."""
    state = torch.full((n + 2, hv, dv, dk), float("nan"), device=DEVICE)
    indices = torch.randperm(n + 2, device=DEVICE)[:n].to(torch.int32)
    state[indices.long()] = torch.randn(n, hv, dv, dk, device=DEVICE) * 0.1
    return state, indices


@pytest.mark.parametrize(("dk", "dv"), SIZES)
@pytest.mark.parametrize("kernel", [gated_delta_rule_chunked, gated_delta_rule_recurrent])
def test_rules_at_any_head_size_match_reference(kernel, dk, dv):
    # the chunked kernel crosses a chunk edge (64); the recurrent one runs decode and short prefills
    lengths = [70, 5] if kernel is gated_delta_rule_chunked else [1, 6, 3]
    hk, hv = 1, 2
    q, k, v, g, beta = _inputs(lengths, hk, hv, dk, dv)
    state, indices = _slots(len(lengths), hv, dk, dv)
    has_init = torch.tensor([i % 2 == 0 for i in range(len(lengths))], device=DEVICE)
    ref_state = state.clone()
    cu = _cu(lengths)
    want = gated_delta_rule_recurrent(
        q, k, v, g, beta, cu, ref_state, indices, has_initial_state=has_init, backend="torch"
    )
    got = kernel(q, k, v, g, beta, cu, state, indices, has_initial_state=has_init, backend="triton")
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(state, ref_state, rtol=2e-3, atol=2e-3, equal_nan=True)


@pytest.mark.parametrize(("dk", "dv"), [(192, 192), (160, 24)] if GPU else [(160, 24)])
@pytest.mark.parametrize("kernel", [gated_delta_rule_chunked, gated_delta_rule_recurrent])
def test_key_heads_wider_than_128_in_16_bit_activations(kernel, dk, dv):
    """16-bit activations take key heads up to 256 (the chunk's keys in shared memory at half the bytes)."""
    lengths = [70, 5] if kernel is gated_delta_rule_chunked else [1, 6, 3]
    q, k, v, g, beta = _inputs(lengths, 1, 2, dk, dv, LOW)
    state, indices = _slots(len(lengths), 2, dk, dv)
    ref_state = state.clone()
    cu = _cu(lengths)
    want = gated_delta_rule_recurrent(q, k, v, g, beta, cu, ref_state, indices, backend="torch")
    got = kernel(q, k, v, g, beta, cu, state, indices, backend="triton")
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(state, ref_state, rtol=5e-2, atol=5e-2, equal_nan=True)


def test_keys_wider_than_the_kernels_take_are_refused_by_name():
    assert max_key_head_size(torch.float32) == 128 and max_key_head_size(torch.bfloat16) == 256
    check_gdn_head_sizes(128, 512, torch.float32)  # any value head
    check_gdn_head_sizes(256, 24, torch.bfloat16)
    with pytest.raises(ValueError, match=r"key heads of 192 are wider than the chunked kernel's 128"):
        check_gdn_head_sizes(192, 192, torch.float32)
    with pytest.raises(ValueError, match=r"key heads of 320 are wider than the chunked kernel's 256"):
        check_gdn_head_sizes(320, 64, torch.float16)
    q, k, v, g, beta = _inputs([3], 1, 1, 192, 16)
    state, indices = _slots(1, 1, 192, 16)
    for kernel in (gated_delta_rule_chunked, gated_delta_rule_recurrent):
        with pytest.raises(ValueError, match=r"key heads of 192"):
            kernel(q, k, v, g, beta, _cu([3]), state, indices, backend="triton")


@pytest.mark.parametrize(("dk", "dv"), SIZES[:2])
def test_verify_states_at_any_head_size_match_reference(dk, dv):
    """Speculative verify: each token's state goes to its own slot, at padded widths too."""
    hk, hv, lengths = 1, 2, [3, 2]
    q, k, v, g, beta = _inputs(lengths, hk, hv, dk, dv)
    state, indices = _slots(len(lengths), hv, dk, dv)
    spare = torch.full((5, hv, dv, dk), float("nan"), device=DEVICE)
    state = torch.cat([state, spare])
    first = len(lengths) + 2
    steps = torch.tensor([first, first + 1, -1, first + 3, first + 4], dtype=torch.int32, device=DEVICE)
    ref_state = state.clone()
    cu = _cu(lengths)
    want = gated_delta_rule_recurrent(
        q, k, v, g, beta, cu, ref_state, indices, step_state_indices=steps, backend="torch"
    )
    got = gated_delta_rule_recurrent(
        q, k, v, g, beta, cu, state, indices, step_state_indices=steps, backend="triton"
    )
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(state, ref_state, rtol=2e-3, atol=2e-3, equal_nan=True)


def test_padded_head_sizes():
    assert [padded_head_size(n) for n in (1, 8, 16, 24, 48, 96, 128, 192, 256)] == [
        16,
        16,
        16,
        32,
        64,
        128,
        128,
        256,
        256,
    ]
