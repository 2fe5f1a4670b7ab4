"""The shared expert folded into the MoE combine (moe/shared.py): fused_experts with a SharedExpert gives
the routed experts' sum plus the shared output scaled by its gate's sigmoid (or as is), in the Triton
kernels and the torch backend, against the references; bad shapes are named."""

import pytest
import torch

from atom_kernels import fused_experts
from atom_kernels.moe import SharedExpert
from atom_kernels.moe.combine import combine_topk
from atom_kernels.moe.ref import fused_experts_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 3e-2}


def _experts(tokens, experts, k, hidden, inter, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(DEVICE, dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(DEVICE, dtype)
    ids = torch.rand(tokens, experts, generator=gen).topk(k, dim=-1).indices.to(DEVICE, torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, generator=gen), dim=-1).to(DEVICE)
    shared = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    gate = (torch.randn(tokens, 1, generator=gen) * 3).to(DEVICE, dtype)
    return x, w13, w2, weights, ids, shared, gate


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "plain"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "experts", "k", "hidden", "inter"), [(1, 8, 4, 64, 32), (7, 6, 2, 100, 48)]
)
def test_the_shared_term_joins_the_routed_sum(tokens, experts, k, hidden, inter, dtype, backend, gated):
    x, w13, w2, weights, ids, shared, gate = _experts(tokens, experts, k, hidden, inter, dtype)
    term = SharedExpert(shared, gate if gated else None)
    got = fused_experts(x, w13, w2, weights, ids, shared=term, backend=backend)
    scale = torch.sigmoid(gate.float()) if gated else 1.0
    want = fused_experts_ref(x, w13, w2, weights, ids).float() + scale * shared.float()
    torch.testing.assert_close(got.float(), want, rtol=TOL[dtype], atol=TOL[dtype])
    if gated:  # the gate matters: without it the result moves
        plain = fused_experts(x, w13, w2, weights, ids, shared=SharedExpert(shared), backend=backend)
        assert not torch.allclose(plain, got, rtol=TOL[dtype], atol=TOL[dtype])


def test_the_combine_adds_a_strided_shared_row_and_a_flat_gate():
    tokens, k, hidden = 3, 2, 40
    y = torch.randn(tokens * k, hidden, device=DEVICE)
    wide = torch.randn(tokens, hidden + 8, device=DEVICE)  # the shared output as a view of a wider buffer
    gate = torch.randn(tokens, device=DEVICE)
    out = combine_topk(y, k, torch.empty(tokens, hidden, device=DEVICE), SharedExpert(wide[:, :hidden], gate))
    want = y.view(tokens, k, hidden).sum(1) + torch.sigmoid(gate)[:, None] * wide[:, :hidden]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_bad_shared_terms_are_named():
    x, w13, w2, weights, ids, shared, gate = _experts(4, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match=r"shared expert's output must be \[T, H\] = \[4, 32\]"):
        fused_experts(x, w13, w2, weights, ids, shared=SharedExpert(shared[:3]))
    with pytest.raises(ValueError, match=r"shared expert's gate must be \[T\] or \[T, 1\] = \[4\]"):
        fused_experts(x, w13, w2, weights, ids, shared=SharedExpert(shared, gate[:2]))
