"""ATOM's GDN layer against SGLang's own GDN attention test kit: the kit's ModelRunner subclass with the real
HybridReqToTokenPool (MambaPool state slots, seeded prefix states), ForwardBatch, the HybridLinearAttnBackend
it builds (the `atom` backend on the full side, SGLang's GDN backend's metadata on the linear side), and its
pure-torch reference. The kit's module calls SGLang's RadixLinearAttention; here the same weights and inputs
go through SglangGDNLayer instead, with a GDNLayerSpec read off the kit's layer (its conv has no activation).
fp32 on the CPU (the kit's default bf16/CUDA is not this machine's)."""

import dataclasses
import unittest

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.test.kits.attention_unittest.attention_methods import gdn_attention as kit
from sglang.test.kits.attention_unittest.runner_modes import speculative_target_verify_runner as verify_kit
from torch import nn

from atom_core.integration import GDNLayerSpec
from atom_sglang.attention.gdn import SglangGDNLayer
from atom_sglang.plugin import register
from atom_sglang.runtime import sglang_forward

CASES = kit.make_gdn_cases("atom")
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(autouse=True)
def cpu_rng(monkeypatch):
    """The kit saves and restores the CUDA generator around its prefix-state seeding; the CPU one stands in."""
    assert register()
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: torch.random.get_rng_state())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=None: None)


class AtomKitGDN(nn.Module):
    """The kit module's contract (forward_batch, mixed_qkv, a, b) -> [1, T, HV, Dv], computed by ATOM's layer
    from the kit layer's own weights."""

    def __init__(self, kit_module):
        super().__init__()
        attn = kit_module.attn
        self.kit_module = kit_module
        self.layer = SglangGDNLayer(
            GDNLayerSpec(
                layer_index=0,
                num_k_heads=kit_module.num_k_heads,
                num_v_heads=kit_module.num_v_heads,
                head_k_dim=kit_module.head_k_dim,
                head_v_dim=kit_module.head_v_dim,
                conv_width=attn.conv_weights.shape[1],
                state_dtype=torch.float32,
                prefix="kit.attn",
                conv_activation=attn.activation,
            ),
            layer_id=attn.layer_id,
        )

    def forward(self, forward_batch, mixed_qkv, a, b):
        m = self.kit_module
        with sglang_forward(forward_batch):
            out = self.layer(mixed_qkv, b, a, m.attn.conv_weights, m.A_log, m.dt_bias)
        return out[None]


def _fixture(case):
    with torch.no_grad():
        fx = kit.build_gdn_attention_fixture(unittest.TestCase(), case, device="cpu", dtype=torch.float32)
    fx.actual_module = AtomKitGDN(fx.actual_module)
    return fx


def test_the_kit_layer_has_no_conv_activation():
    """Why the spec below carries conv_activation=None: with SiLU the kit's reference would not hold."""
    fx = _fixture(CASES[0])
    assert fx.actual_module.kit_module.attn.activation is None
    assert not fx.actual_module.layer.spec.conv_silu


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_extend_and_decode_match_the_kits_reference(case):
    fx = _fixture(case)
    initial = kit._ssm_states(fx).clone()
    slots = kit._cache_indices(fx)
    actual = kit.run_gdn_fixture_eager(fx)
    expected = kit._pure_torch_gdn_reference(fx, initial)
    torch.testing.assert_close(actual, expected.output, **TOL)
    # every case, not only the kit's decode ones: the final states are what the next step resumes from
    torch.testing.assert_close(kit._ssm_states(fx)[slots], expected.final_states[slots], **TOL)


def test_a_conv_with_history_reads_and_advances_sglangs_conv_state():
    """The kit's conv carries history only in its multi-item cases (scoring, not generation), where its
    reference starts from zeros. Here a decode step with history weight 0.5 starts from random conv states
    in SGLang's MambaPool; the expected output is the kit's math written out for one token."""
    case = dataclasses.replace(
        next(c for c in CASES if c.name == "gdn_decode_page_boundary"), conv_history_weight=0.5
    )
    fx = _fixture(case)
    conv = kit._conv_states(fx)
    slots = kit._cache_indices(fx).long()
    conv[slots] = torch.randn_like(conv[slots])  # the token before each decode step
    before = conv[slots, :, -1].clone()
    initial = kit._ssm_states(fx).clone()
    actual = kit.run_gdn_fixture_eager(fx)
    mixed = 0.5 * before + fx.mixed_qkv  # weights [0.5, 1] over (previous input, this input), no activation
    q, k, v = fx.reference_module.split_qkv(mixed)
    g, beta = kit._pure_torch_gdn_gating(fx.reference_module, fx.a, fx.b)
    q = torch.nn.functional.normalize(q[0], dim=-1, eps=1e-6**0.5) * fx.reference_module.head_k_dim**-0.5
    k = torch.nn.functional.normalize(k[0], dim=-1, eps=1e-6**0.5)
    state = initial[slots] * g.exp()[:, :, None, None]
    state = (
        state + (beta[:, :, None] * (v[0] - (state @ k[:, :, :, None])[..., 0]))[..., None] * k[:, :, None, :]
    )
    expected = (state @ q[:, :, :, None])[..., 0]
    torch.testing.assert_close(actual[0], expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(conv[slots, :, -1], fx.mixed_qkv)  # the window moved on by this token


@pytest.mark.parametrize("draft_tokens", [2, 4])
def test_chain_target_verify_matches_the_kits_reference(draft_tokens):
    """The kit's EAGLE chain verify (topk 1): every drafted token's output from the running state, the
    requests' own states left for SGLang's post-verify commit."""
    case = kit.GDNAttentionCase(
        name=f"gdn_verify_{draft_tokens}",
        backend="atom",
        forward_mode=ForwardMode.TARGET_VERIFY,
        num_k_heads=2,
        num_v_heads=2,
        page_size=16,
        prefix_lens=(5, 16, 9),
        extend_lens=(draft_tokens,) * 3,
    )
    fx = _fixture(case)
    batch = fx.forward_batch
    verify_kit._prepare_target_verify_batch(batch, case, "cpu")
    batch.spec_info = verify_kit._make_spec_verify_input(case, batch, topk=1, device="cpu", spec_kind="eagle")
    inputs = kit.gdn_fixture_inputs(fx)
    initial = kit._clone_gdn_cache(fx)
    expected = kit.expected_gdn_verify_output_from_inputs(fx, case, inputs, initial, topk=1)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=fx.backend)):
        fx.backend.init_forward_metadata(batch)
        actual = kit.run_gdn_forward(fx, batch, inputs)
    torch.testing.assert_close(actual, expected, **TOL)
    torch.testing.assert_close(kit._ssm_states(fx), initial[1])  # untouched until the commit
