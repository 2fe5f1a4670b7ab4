"""Gated delta net kernels against the torch references, and the references against transformers' own
Qwen3-Next functions (torch_recurrent/chunk_gated_delta_rule, causal_conv1d_fn/update)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from atom_kernels.gdn import (
    Gating,
    causal_conv1d,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    gdn_gating,
    gdn_tiles,
)
from atom_kernels.gdn.ref import gdn_gating_ref

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
DK, DV = (128, 128) if GPU else (32, 64)  # Dv 64: two 32-wide value blocks per head on the CPU too
HF = "transformers.models.qwen3_next.modeling_qwen3_next"


def _cu(lengths, device=DEVICE):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu.to(device)


def _gdn_inputs(lengths, hk, hv, dtype, device=DEVICE):
    tokens = sum(lengths)
    q = torch.randn(tokens, hk, DK, device=device).to(dtype)
    k = torch.randn(tokens, hk, DK, device=device).to(dtype)
    v = torch.randn(tokens, hv, DV, device=device).to(dtype)
    g = -torch.rand(tokens, hv, device=device) * 0.3  # log decays <= 0
    beta = torch.rand(tokens, hv, device=device).to(dtype)
    return q, k, v, g, beta


def test_gating_matches_reference_and_transformers_formula():
    hv, tokens = 6, 9
    A_log, dt_bias = torch.randn(hv, device=DEVICE), torch.randn(hv, device=DEVICE)
    a = torch.randn(tokens, hv, device=DEVICE) * 10  # past softplus' linear threshold too
    b = torch.randn(tokens, hv, device=DEVICE, dtype=torch.float16)
    g, beta = gdn_gating(A_log, a, dt_bias, b, backend="triton")
    want_g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)  # Qwen3NextGatedDeltaNet.forward's lines
    torch.testing.assert_close(g, want_g, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(beta, b.sigmoid(), rtol=1e-3, atol=1e-3)
    ref_g, ref_beta = gdn_gating_ref(A_log, a, dt_bias, b)
    torch.testing.assert_close(g, ref_g, rtol=1e-5, atol=1e-5)
    assert beta.dtype == ref_beta.dtype == torch.float16


@pytest.mark.parametrize("use_chunks", [False, True])
def test_reference_equals_transformers(use_chunks):
    """Two torch implementations of the same math, compared on the CPU in fp32."""
    import importlib
    import inspect

    hf = importlib.import_module(HF)
    lengths, hk, hv = [70, 5], 2, 4
    q, k, v, g, beta = _gdn_inputs(lengths, hk, hv, torch.float32, device="cpu")
    state = torch.randn(3, hv, DV, DK) * 0.1
    initial = state.clone()
    cu = _cu(lengths, device="cpu")
    out = gated_delta_rule_recurrent(q, k, v, g, beta, cu, state, torch.tensor([2, 0]), backend="torch")
    fn = hf.torch_chunk_gated_delta_rule if use_chunks else hf.torch_recurrent_gated_delta_rule
    fn = inspect.unwrap(fn)  # the torch reference itself: transformers dispatches to fla when it is installed
    for s, slot in enumerate((2, 0)):
        a, e = int(cu[s]), int(cu[s + 1])
        q_s, k_s = (x[a:e].repeat_interleave(hv // hk, dim=1)[None] for x in (q, k))
        want, final = fn(
            q_s,
            k_s,
            v[a:e][None],
            g=g[a:e][None],
            beta=beta[a:e][None],
            initial_state=initial[slot].transpose(-1, -2)[None],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        torch.testing.assert_close(out[a:e], want[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(state[slot], final[0].transpose(-1, -2), rtol=1e-4, atol=1e-4)


CASES = [  # lengths (chunk edges at 64), key heads, value heads
    ([1, 63, 64, 65], 2, 4),
    ([130, 7], 1, 1),
    ([3, 200], 2, 2),
]
# The recurrent kernel walks each sequence token by token and has no chunk edges: under the CPU
# interpreter it gets the same heads over short sequences (the 200-token case alone took 17 s there).
RECURRENT_CASES = CASES if GPU else [([1, 6, 9, 2], 2, 4), ([13, 7], 1, 1), ([3, 20], 2, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("kernel", "lengths", "hk", "hv"),
    [(gated_delta_rule_chunked, *case) for case in CASES]
    + [(gated_delta_rule_recurrent, *case) for case in RECURRENT_CASES],
)
def test_kernels_match_reference(kernel, lengths, hk, hv, dtype):
    q, k, v, g, beta = _gdn_inputs(lengths, hk, hv, dtype)
    slots = len(lengths) + 2
    state = torch.full((slots, hv, DV, DK), float("nan"), device=DEVICE)
    indices = torch.randperm(slots, device=DEVICE)[: len(lengths)].to(torch.int32)
    state[indices.long()] = torch.randn(len(lengths), hv, DV, DK, device=DEVICE) * 0.1
    has_init = torch.tensor([i % 2 == 0 for i in range(len(lengths))], device=DEVICE)
    state[indices[1].long()] = float("nan")  # a new request: its slot's old contents must not be read
    ref_state = state.clone()
    cu = _cu(lengths)
    want = gated_delta_rule_recurrent(
        q, k, v, g, beta, cu, ref_state, indices, has_initial_state=has_init, backend="torch"
    )
    out = torch.full_like(v, float("nan"))
    got = kernel(q, k, v, g, beta, cu, state, indices, has_initial_state=has_init, out=out, backend="triton")
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(got).any()
    tol = {torch.float32: 2e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(state[indices.long()], ref_state[indices.long()], rtol=tol, atol=tol)


LOW = torch.bfloat16 if GPU else torch.float16


@pytest.mark.parametrize(
    "change",
    [
        dict(lowp=True),  # 16-bit matmul operands in the state and output kernels (the GPU default)
        dict(lowp=False, state_block_v=16, out_block_v=DV),  # fp32 operands, other value blocks
    ],
)
def test_chunked_tiles_match_reference(change):
    lengths, hk, hv = [70, 130], 1, 2
    q, k, v, g, beta = _gdn_inputs(lengths, hk, hv, LOW)
    state = torch.randn(2, hv, DV, DK, device=DEVICE) * 0.1
    ref_state = state.clone()
    indices = torch.tensor([1, 0], device=DEVICE, dtype=torch.int32)
    cu = _cu(lengths)
    want = gated_delta_rule_recurrent(q, k, v, g, beta, cu, ref_state, indices, backend="torch")
    tiles = dataclasses.replace(gdn_tiles(LOW, DV, interpret=not GPU), **change)
    got = gated_delta_rule_chunked(q, k, v, g, beta, cu, state, indices, backend="triton", tiles=tiles)
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(state, ref_state, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize(
    ("change", "message"),
    [(dict(state_block_v=DV * 2), "must divide Dv"), (dict(state_stages=1), "state_stages must be >= 2")],
)
def test_chunked_tiles_are_checked(change, message):
    q, k, v, g, beta = _gdn_inputs([5], 1, 1, torch.float32)
    state = torch.zeros(1, 1, DV, DK, device=DEVICE)
    tiles = dataclasses.replace(gdn_tiles(torch.float32, DV), **change)
    with pytest.raises(ValueError, match=message):
        gated_delta_rule_chunked(
            q,
            k,
            v,
            g,
            beta,
            _cu([5]),
            state,
            torch.zeros(1, device=DEVICE, dtype=torch.int32),
            backend="triton",
            tiles=tiles,
        )


@pytest.mark.parametrize("block_v", [1, 2, 4])
def test_small_value_blocks_match_reference(block_v):
    """The value blocks small batches take on the GPU (down to 2 rows a program; the interpreter's default
    keeps 8): a verify's ragged tokens over slots, padding included, state and outputs as the reference's."""
    hk, hv, lengths = 2, 4, [1, 3, 2]
    state = torch.randn(6, hv, DV, DK, device=DEVICE) * 0.1
    indices = torch.tensor([4, -1, 1], dtype=torch.int32, device=DEVICE)
    ref_state = state.clone()
    q, k, v, g, beta = _gdn_inputs(lengths, hk, hv, torch.float32)
    cu = _cu(lengths)
    want = gated_delta_rule_recurrent(q, k, v, g, beta, cu, ref_state, indices, backend="torch")
    got = gated_delta_rule_recurrent(q, k, v, g, beta, cu, state, indices, backend="triton", block_v=block_v)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, ref_state, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("state_dtype", [torch.float32] + ([torch.bfloat16] if GPU else []))
def test_decode_steps_over_slots_with_padding(state_dtype):
    """Decode: one token per sequence, state slots in any order, -1 = a padding row (zeros out, no state)."""
    hk, hv, batch = 2, 4, 5
    state = (torch.randn(8, hv, DV, DK, device=DEVICE) * 0.1).to(state_dtype)
    indices = torch.tensor([6, -1, 0, 3, -1], dtype=torch.int32, device=DEVICE)
    ref_state = state.clone()
    cu = _cu([1] * batch)
    for _ in range(3):  # consecutive steps carry the state
        q, k, v, g, beta = _gdn_inputs([1] * batch, hk, hv, torch.float32)
        want = gated_delta_rule_recurrent(q, k, v, g, beta, cu, ref_state, indices, backend="torch")
        got = gated_delta_rule_recurrent(q, k, v, g, beta, cu, state, indices, backend="triton")
        tol = 1e-4 if state_dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        assert not got[indices < 0].any(), "padding rows must be zeros"
    # a bf16 state is rounded from fp32 sums taken in another order: one bf16 step (<= 2^-7 relative) apart
    stol = dict(rtol=1e-4, atol=1e-4) if state_dtype == torch.float32 else dict(rtol=8e-3, atol=1e-3)
    torch.testing.assert_close(state.float(), ref_state.float(), **stol)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_recurrent_step_computes_its_own_gating(backend):
    """gating= (gdn_gating's inputs, a and b strided rows of one projection) in place of g and beta: the
    same outputs and states as gdn_gating then the rule, verify step slots included."""
    hk, hv = 2, 4
    state = torch.randn(6, hv, DV, DK, device=DEVICE) * 0.1
    indices = torch.tensor([4, -1, 1], dtype=torch.int32, device=DEVICE)
    lens = [2, 1, 3]
    q, k, v, _, _ = _gdn_inputs(lens, hk, hv, torch.float16)
    ab = torch.randn(sum(lens), 3 * hv, device=DEVICE, dtype=torch.float16)  # a | b | other columns
    a, b = ab[:, :hv], ab[:, hv : 2 * hv]
    A_log, dt_bias = torch.randn(hv, device=DEVICE), torch.randn(hv, device=DEVICE)
    steps = torch.tensor([0, 5, 2, 3, 2, -1], dtype=torch.int32, device=DEVICE)
    for step_slots in (None, steps):
        want_state, got_state = state.clone(), state.clone()
        g, beta = gdn_gating(A_log, a, dt_bias, b, backend=backend)
        want = gated_delta_rule_recurrent(
            q, k, v, g, beta, _cu(lens), want_state, indices, step_state_indices=step_slots, backend=backend
        )
        got = gated_delta_rule_recurrent(
            q, k, v, None, None, _cu(lens), got_state, indices, step_state_indices=step_slots,
            gating=Gating(A_log, a, dt_bias, b), backend=backend,
        )  # fmt: skip
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(got_state, want_state, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="g and beta, or gating"):
        gated_delta_rule_recurrent(
            q, k, v, g, beta, _cu(lens), state, indices, gating=Gating(A_log, a, dt_bias, b), backend=backend
        )


def test_conv_reference_equals_transformers():
    import importlib

    hf = importlib.import_module(HF)
    dim, width, length = 12, 4, 9
    x, weight, bias = torch.randn(length, dim), torch.randn(dim, width), torch.randn(dim)
    state = torch.zeros(1, dim, width - 1)
    out = causal_conv1d(x, weight, bias, torch.tensor([0, length]), state, torch.tensor([0]), backend="torch")
    want = hf.causal_conv1d_fn(x.t()[None], weight, bias, activation="silu")[0].t()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    # one decode step from that state equals transformers' update
    step = torch.randn(1, dim)
    hf_state = torch.cat([torch.zeros(dim, 1), x.t()], 1)[:, -width:][
        None
    ].clone()  # its state keeps W inputs
    want_step = hf.causal_conv1d_update(step.t()[None], hf_state, weight, bias, activation="silu")[0].t()
    got_step = causal_conv1d(
        step, weight, bias, torch.tensor([0, 1]), state, torch.tensor([0]), backend="torch"
    )
    torch.testing.assert_close(got_step, want_step, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths", [[1, 2, 9, 40], [1, 1, 1, 1], [70, 3]])
def test_conv_kernel_matches_reference(lengths, dtype):
    dim, width = 40, 4
    cu = _cu(lengths)
    x = torch.randn(sum(lengths), dim, device=DEVICE).to(dtype)
    weight, bias = torch.randn(dim, width, device=DEVICE).to(dtype), torch.randn(dim, device=DEVICE).to(dtype)
    slots = len(lengths) + 3
    state = torch.randn(slots, dim, width - 1, device=DEVICE).to(dtype)
    indices = torch.tensor(
        [5, 0, -1, 2][: len(lengths)] if len(lengths) > 2 else [4, 1], dtype=torch.int32, device=DEVICE
    )
    has_init = torch.tensor([True, False, True, True][: len(lengths)], device=DEVICE)
    ref_state = state.clone()
    want = causal_conv1d(x, weight, bias, cu, ref_state, indices, has_initial_state=has_init, backend="torch")
    got = causal_conv1d(
        x,
        weight,
        bias,
        cu,
        state,
        indices,
        has_initial_state=has_init,
        max_seqlen=max(lengths),
        backend="triton",
    )
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(state, ref_state, rtol=tol, atol=tol)
    # without max_seqlen the grid covers T positions per sequence: same result, idle programs exit
    state2 = ref_state.clone()
    again = causal_conv1d(
        x, weight, bias, cu, state2, indices, has_initial_state=torch.ones_like(has_init), backend="triton"
    )
    want2 = causal_conv1d(x, weight, bias, cu, ref_state, indices, backend="torch")
    torch.testing.assert_close(again, want2, rtol=tol, atol=tol)
    torch.testing.assert_close(state2, ref_state, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(v=torch.zeros(5, 3, DV)), r"multiple of key heads"),
        (dict(g=torch.zeros(5, 3)), r"g and beta must be \[T, HV\]"),
        (dict(state=torch.zeros(2, 4, DK, DV + 16)), r"state must be \[slots, 4"),
        (dict(cu=torch.tensor([0, 5], dtype=torch.int32)), r"disagree"),
    ],
)
def test_bad_input_is_named(change, message):
    args = dict(
        q=torch.zeros(5, 2, DK),
        k=torch.zeros(5, 2, DK),
        v=torch.zeros(5, 4, DV),
        g=torch.zeros(5, 4),
        beta=torch.zeros(5, 4),
        cu=torch.tensor([0, 2, 5], dtype=torch.int32),
        state=torch.zeros(2, 4, DV, DK),
        idx=torch.tensor([0, 1], dtype=torch.int32),
    )
    args.update(change)
    a = {n: t.to(DEVICE) for n, t in args.items()}
    for kernel in (gated_delta_rule_chunked, gated_delta_rule_recurrent):
        with pytest.raises(ValueError, match=message):
            kernel(a["q"], a["k"], a["v"], a["g"], a["beta"], a["cu"], a["state"], a["idx"])
