"""Experts with biases and GPT-OSS's clamped SwiGLU (expert_mlp.py): the Triton GEMMs, the torch backend's
capture-safe form and the reference against each other, and the reference against the formula written out."""

import pytest
import torch

from atom_kernels import fused_experts
from atom_kernels.moe import ExpertActivation, ExpertBiases
from atom_kernels.moe.fused import _experts_static
from atom_kernels.moe.ref import fused_experts_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 3e-2}
OAI = ExpertActivation("swiglu_oai", alpha=1.702, limit=1.5)  # a low limit: the clamps bite


def _experts(tokens, experts, k, hidden, inter, dtype, scale=3.0):
    """Weights scaled up so that gate and up cross the clamp's limits on both sides."""
    x = torch.randn(tokens, hidden, device=DEVICE).to(dtype)
    w13 = (scale * torch.randn(experts, 2 * inter, hidden, device=DEVICE) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=DEVICE) / inter**0.5).to(dtype)
    biases = ExpertBiases(
        torch.randn(experts, 2 * inter, device=DEVICE).to(dtype), torch.randn(experts, hidden, device=DEVICE)
    )
    ids = torch.rand(tokens, experts, device=DEVICE).topk(k, dim=-1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, device=DEVICE), dim=-1)
    return x, w13, w2, weights, ids, biases


def test_swiglu_oai_reference_is_the_published_formula():
    gate, up = torch.linspace(-4, 4, 33), torch.linspace(3, -3, 33)
    g = torch.where(gate > 1.5, torch.tensor(1.5), gate)
    u = torch.where(up > 1.5, torch.tensor(1.5), torch.where(up < -1.5, torch.tensor(-1.5), up))
    want = (u + 1) * g / (1 + torch.exp(-1.702 * g))
    torch.testing.assert_close(OAI.ref(gate, up), want)
    assert (OAI.ref(gate, up) != ExpertActivation().ref(gate, up)).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [ExpertActivation(), OAI], ids=["silu", "swiglu_oai"])
@pytest.mark.parametrize(
    ("tokens", "experts", "k", "hidden", "inter"),
    [(1, 4, 2, 32, 16), (7, 8, 2, 48, 24), (40, 6, 3, 64, 40)],
)
def test_triton_experts_with_biases_match_the_reference(tokens, experts, k, hidden, inter, activation, dtype):
    x, w13, w2, weights, ids, biases = _experts(tokens, experts, k, hidden, inter, dtype)
    got = fused_experts(x, w13, w2, weights, ids, activation=activation, biases=biases, backend="triton")
    want = fused_experts_ref(x, w13, w2, weights, ids, activation, biases)
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    plain = fused_experts_ref(x, w13, w2, weights, ids)
    assert not torch.allclose(want, plain, atol=0.1), "the biases and activation must change the answer"


@pytest.mark.parametrize(("experts", "k", "tokens"), [(8, 2, 3), (4, 2, 5)])
def test_capture_safe_torch_form_with_biases_equals_the_reference(experts, k, tokens):
    """Both of its forms: gathered experts (tokens * k < experts) and every expert densely."""
    x, w13, w2, weights, ids, biases = _experts(tokens, experts, k, 32, 24, torch.float32)
    torch.testing.assert_close(
        _experts_static(x, w13, w2, weights, ids, OAI, biases),
        fused_experts_ref(x, w13, w2, weights, ids, OAI, biases),
        rtol=1e-5,
        atol=1e-5,
    )


def test_bad_biases_and_activations_are_named():
    x, w13, w2, weights, ids, biases = _experts(3, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match=r"w2 bias must be a contiguous float tensor \(4, 32\)"):
        fused_experts(x, w13, w2, weights, ids, biases=ExpertBiases(biases.w13, biases.w2[:, :8]))
    with pytest.raises(ValueError, match="'gelu' is not supported"):
        ExpertActivation("gelu")
