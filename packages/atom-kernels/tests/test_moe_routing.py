"""Routing kernels against the torch references and against transformers' own routers."""

import pytest
import torch

from atom_kernels import grouped_topk, topk_softmax
from atom_kernels.moe.ref import topk_softmax_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOGIT_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def _distinct_logits(tokens, experts, dtype=torch.float32):
    """Distinct per row even in fp16 (steps of 1/16), so the top k is unambiguous."""
    ranks = torch.argsort(torch.rand(tokens, experts, device=DEVICE), dim=1)
    return (ranks * 0.0625 - experts * 0.03125).to(dtype)


def _poisoned_outputs(tokens, k):
    weights = torch.full((tokens, k), float("nan"), device=DEVICE)
    ids = torch.full((tokens, k), -7, dtype=torch.int32, device=DEVICE)
    return dict(weights=weights, ids=ids)


@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(
    ("tokens", "experts", "k"), [(1, 8, 2), (7, 60, 4), (33, 128, 8), (5, 64, 6), (3, 4, 4)]
)
def test_topk_softmax_matches_reference(tokens, experts, k, renormalize, dtype):
    logits = _distinct_logits(tokens, experts, dtype)
    weights, ids = topk_softmax(logits, k, renormalize, **_poisoned_outputs(tokens, k), backend="triton")
    ref_w, ref_ids = topk_softmax_ref(logits, k, renormalize)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("round_to", [torch.bfloat16, torch.float16])
def test_weights_rounded_to_the_models_dtype_stay_fp32(round_to, backend):
    """What route() hands fused_experts: each weight exactly the reference's cast to the model's dtype,
    stored in fp32 (no conversion launches either side)."""
    logits = _distinct_logits(9, 64, torch.float32)
    weights, ids = topk_softmax(logits, 6, True, round_to=round_to, backend=backend)
    ref_w, ref_ids = topk_softmax_ref(logits, 6, True)
    assert weights.dtype == torch.float32 and torch.equal(ids, ref_ids)
    assert torch.equal(weights, ref_w.to(round_to).float())
    assert not torch.equal(weights, ref_w)  # the rounding happened
    with pytest.raises(ValueError, match="round_to must be one of"):
        topk_softmax(logits, 6, True, round_to=torch.int32, backend=backend)


def test_ties_go_to_the_lower_expert_id():
    logits = torch.zeros(2, 8, device=DEVICE)
    logits[1, 5] = 1.0
    _, ids = topk_softmax(logits, 3, True, backend="triton")
    assert ids.tolist() == [[0, 1, 2], [5, 0, 1]]


def test_topk_softmax_matches_transformers_qwen3_moe_router():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    config = Qwen3MoeConfig(hidden_size=32, num_experts=24, num_experts_per_tok=4, norm_topk_prob=True)
    router = Qwen3MoeTopKRouter(config).to(DEVICE)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(9, 32, device=DEVICE)
    logits, hf_weights, hf_ids = router(x)
    weights, ids = topk_softmax(logits, 4, True, backend="triton")
    assert torch.equal(ids.long(), hf_ids)
    torch.testing.assert_close(weights, hf_weights.float(), rtol=1e-5, atol=1e-6)


GROUPED = [  # (experts, groups, kept groups, k)
    (64, 8, 4, 8),
    (32, 4, 2, 6),
    (16, 1, 1, 3),
    (256, 8, 4, 8),  # DeepSeek-V3
]


@pytest.mark.parametrize(("experts", "groups", "kept", "k"), GROUPED)
@pytest.mark.parametrize(
    ("scoring", "with_bias", "renormalize", "scaling"),
    [("sigmoid", True, True, 2.5), ("softmax", False, False, 1.0), ("sigmoid", False, True, 1.0)],
)
def test_grouped_topk_matches_reference(experts, groups, kept, k, scoring, with_bias, renormalize, scaling):
    tokens = 11
    logits = torch.randn(tokens, experts, device=DEVICE) * 2
    bias = torch.randn(experts, device=DEVICE) * 0.5 if with_bias else None
    kwargs = dict(
        num_groups=groups,
        topk_groups=kept,
        bias=bias,
        scoring=scoring,
        renormalize=renormalize,
        scaling=scaling,
    )
    weights, ids = grouped_topk(logits, k, **kwargs, **_poisoned_outputs(tokens, k), backend="triton")
    ref_w, ref_ids = grouped_topk(logits, k, **kwargs, backend="torch")
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)
    group_of = ids.long() // (experts // groups)
    assert all(len(set(row.tolist())) <= kept for row in group_of), "an expert outside the kept groups"


def test_grouped_topk_matches_transformers_deepseek_v3_router():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = DeepseekV3Config(
        hidden_size=48,
        n_routed_experts=64,
        num_experts_per_tok=6,
        n_group=8,
        topk_group=3,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    )
    router = DeepseekV3TopkRouter(config).to(DEVICE)
    torch.nn.init.normal_(router.weight, std=0.3)
    router.e_score_correction_bias.normal_(std=0.2)
    x = torch.randn(13, 48, device=DEVICE)
    logits, hf_weights, hf_ids = router(x)
    weights, ids = grouped_topk(
        logits,
        6,
        num_groups=8,
        topk_groups=3,
        bias=router.e_score_correction_bias,
        scaling=2.5,
        backend="triton",
    )
    # transformers leaves the k ids unsorted: compare as id-sorted rows.
    hf_order, order = hf_ids.sort(dim=1), ids.long().sort(dim=1)
    assert torch.equal(order.values, hf_order.values)
    torch.testing.assert_close(weights.gather(1, order.indices), hf_weights.gather(1, hf_order.indices))


def test_empty_batch_and_torch_backend():
    empty = torch.randn(0, 16, device=DEVICE)
    assert topk_softmax(empty, 2, True, backend="triton")[1].shape == (0, 2)
    logits = torch.randn(5, 16, device=DEVICE)
    for fn, kwargs in (
        (topk_softmax, dict(renormalize=True)),
        (grouped_topk, dict(num_groups=4, topk_groups=2)),
    ):
        w_t, i_t = fn(logits, 3, **kwargs, backend="torch")
        w_k, i_k = fn(logits, 3, **kwargs, backend="triton")
        assert torch.equal(i_t, i_k)
        torch.testing.assert_close(w_t, w_k)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: topk_softmax(x, 17, True), r"top_k=17"),
        (lambda x: topk_softmax(x[0], 2, True), r"\[T, E\]"),
        (lambda x: grouped_topk(x, 2, num_groups=3, topk_groups=1), r"cannot be split into 3 groups"),
        (lambda x: grouped_topk(x, 9, num_groups=4, topk_groups=2), r"top_k=9 exceeds the 8"),
        (
            lambda x: grouped_topk(x, 2, num_groups=4, topk_groups=2, bias=torch.zeros(3)),
            r"bias must be \[16\]",
        ),
        (lambda x: grouped_topk(x, 2, num_groups=4, topk_groups=2, scoring="relu"), r"scoring must be"),
        (lambda x: grouped_topk(x, 2, num_groups=16, topk_groups=2, bias=torch.zeros(16)), r"2\+ experts"),
        (lambda x: topk_softmax(x, 2, True, ids=torch.empty(4, 2, dtype=torch.int64)), r"ids must be"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(4, 16, device=DEVICE))
