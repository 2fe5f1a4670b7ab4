"""The "atom" backend on MLA models, against SGLang's own MLA attention test kit: its ModelRunner subclass
with the real ReqToTokenPool and MLATokenToKVPool (bf16/fp32 and fp8 storage), ForwardBatch, RadixAttention
and the kit's reference (un-absorbed) attention. DeepSeek shapes need a rotary part, so every case runs
with qk_rope_head_dim 16 (the kit's default 0 is not a DeepSeek shape)."""

import dataclasses
import unittest
from collections import Counter

import pytest
import torch
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.test.kits.attention_unittest.attention_methods import mla_attention as kit
from sglang.test.kits.attention_unittest.runner_modes import speculative_target_verify_runner as verify_kit
from sglang_harness import padded_decode

from atom_sglang.attention.kv_cache import UnsupportedKVPool
from atom_sglang.attention.metadata import UnsupportedForwardMode
from atom_sglang.attention.mla import AtomMLAAttnBackend
from atom_sglang.plugin import register
from tools.testing_seams import record_steps

RANK, ROPE = 32, 16
CASES = kit.make_mla_cases("atom")
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(autouse=True)
def atom_registered():
    assert register()


def _fixture(case, layout="shuffled_pages", **kw):
    with torch.no_grad():  # the kit fills the prefix through parameters that require grad
        return kit.build_mla_attention_fixture(
            unittest.TestCase(),
            case,
            kv_lora_rank=RANK,
            qk_rope_head_dim=ROPE,
            device="cpu",
            dtype=torch.float32,
            loc_layout=layout,
            **kw,
        )


def _case(name):
    [case] = [c for c in CASES if c.name == name]
    return case


def _attend(fx, convention: str, batch=None):
    """The kit module's absorbed attention, handing the step's latent to the backend the way one of
    SGLang's MLA callers does (the kit's own forward is "written": it stores the rows itself)."""
    m, fb = fx.actual_module, batch or fx.forward_batch
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=fx.backend)):
        if convention == "written":
            return m(fx.input_hidden, fb)
        q_nope, k_nope, q_rope, k_rope = m.forward_absorb_prepare(fx.input_hidden)
        if convention == "concatenated":  # SGLang's DeepSeek on backends outside its absorb-core list
            q = torch.cat([q_nope, q_rope], dim=-1).flatten(1, 2)
            out = m.attn_mqa(q, torch.cat([k_nope, k_rope], dim=-1), k_nope, fb, save_kv_cache=True)
        else:  # "split": q_rope / k_rope keywords
            out = m.attn_mqa(q_nope.flatten(1, 2), k_nope, k_nope, fb, q_rope=q_rope, k_rope=k_rope)
        out = out.view(-1, m.num_heads, m.kv_lora_rank)
        return m.o_proj(torch.bmm(out.transpose(0, 1), m.w_vc).transpose(0, 1).flatten(1, 2))


def test_the_factory_gives_mla_runners_the_mla_backend():
    fx = _fixture(CASES[0])
    assert type(ATTENTION_BACKENDS["atom"](fx.runner)) is AtomMLAAttnBackend
    assert fx.backend.max_context_len == kit.DEFAULT_MAX_CONTEXT_LEN


@pytest.mark.parametrize("layout", ["shuffled_pages", "interleaved_pages"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_the_kits_reference(case, layout):
    fx = _fixture(case, layout)
    fx.backend.init_forward_metadata(fx.forward_batch)
    torch.testing.assert_close(_attend(fx, "written"), kit.expected_mla_fixture_output(fx), **TOL)


@pytest.mark.parametrize("convention", ["concatenated", "split"])
@pytest.mark.parametrize(
    "name", ["mla_extend_ragged_page_boundary", "mla_extend_page_size_1", "mla_decode_page_boundary"]
)
def test_the_backend_writes_the_latent_in_either_calling_convention(name, convention):
    fx = _fixture(_case(name))
    fx.backend.init_forward_metadata(fx.forward_batch)
    expected = kit.expected_mla_fixture_output(fx)
    torch.testing.assert_close(_attend(fx, convention), expected, **TOL)
    # The rows landed in SGLang's pool: the kit's own forward (which rewrites them) reads the same rows.
    pool = fx.runner.token_to_kv_pool
    stored = pool.get_key_buffer(0)[fx.forward_batch.out_cache_loc].clone()
    torch.testing.assert_close(_attend(fx, "written"), expected, **TOL)
    torch.testing.assert_close(pool.get_key_buffer(0)[fx.forward_batch.out_cache_loc], stored)


@pytest.mark.parametrize("name", ["mla_extend_ragged_page_boundary", "mla_decode_page_boundary"])
def test_an_fp8_pool_is_read_and_written_in_fp8(name):
    # The torch path: Triton's CPU interpreter gets e4m3 arithmetic wrong (the GPU suite runs the kernel).
    fx = _fixture(_case(name), fp8_kv_cache=True)
    fx.backend = AtomMLAAttnBackend(fx.runner, kernel_backend="torch")
    pool = fx.runner.token_to_kv_pool
    assert pool.store_dtype == torch.uint8 and fx.backend.kv_cache_dtype == torch.float8_e4m3fn
    fx.backend.init_forward_metadata(fx.forward_batch)
    expected = kit.expected_mla_fixture_output(fx)
    actual = _attend(fx, "concatenated")
    err = float((actual - expected).abs().max())
    # e4m3 keeps 3 mantissa bits: well inside 5% of the output's range, and not the unquantized answer.
    assert 0 < err < 0.05 * float(expected.abs().max()), err


def test_decode_graph_buffers_serve_capture_and_replay():
    fx = _fixture(_case("mla_decode_page_boundary"))
    expected = kit.expected_mla_fixture_output(fx)
    fx.backend.init_cuda_graph_state(max_bs=8, max_num_tokens=8)
    batch, hidden = padded_decode(fx, pad=2)
    fx.backend.init_forward_metadata_out_graph(batch, in_capture=True)
    buffers = fx.backend.forward_metadata.paged.block_tables.data_ptr()
    fx.input_hidden = hidden
    actual = _attend(fx, "concatenated", batch)[: fx.case.batch_size]
    torch.testing.assert_close(actual, expected, **TOL)
    fx.backend.init_forward_metadata_out_graph(batch)  # a replay refills the same buffers
    assert fx.backend.forward_metadata.paged.block_tables.data_ptr() == buffers


VERIFY = kit.MLAAttentionCase(
    name="mla_target_verify",
    backend="atom",
    forward_mode=ForwardMode.TARGET_VERIFY,
    num_heads=4,
    page_size=16,
    prefix_lens=(14, 31),
    extend_lens=(3, 3),
)


def _verify(topk: int) -> None:
    verify_kit.run_mla_eagle_verify_case(
        unittest.TestCase(),
        VERIFY,
        topk=topk,
        kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE,
        device="cpu",
        dtype=torch.float32,
    )


def test_chain_target_verify_matches_the_kit(monkeypatch):
    """The seam too: the backend hands the verify step to atom-core's mla_step."""
    import atom_sglang.attention.mla as mla

    steps = record_steps([mla], Counter(), monkeypatch.setattr)
    _verify(topk=1)
    assert steps["mla_step"] > 0


def test_tree_verify_is_refused_by_name():
    with pytest.raises(UnsupportedForwardMode, match=r"chain drafts only .* got topk 2"):
        _verify(topk=2)


def test_sglangs_deepseek_takes_the_absorbed_path_under_atom():
    # SGLang's DeepSeek asks this registry per forward; an unregistered name would get triton's rule, which
    # sends fresh prefills through the un-absorbed MHA layer.
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    fx = _fixture(_case("mla_extend_zero_prefix_exact_page"))
    handler = AttentionBackendRegistry.get_handler("atom")
    assert handler is not AttentionBackendRegistry.get_handler("triton")
    assert handler(fx.actual_module, fx.forward_batch) is AttnForwardMethod.MLA


def test_what_it_does_not_compute_is_refused_by_name():
    fx = _fixture(CASES[0])
    fx.backend.init_forward_metadata(fx.forward_batch)
    layer = fx.actual_module.attn_mqa
    q = torch.randn(fx.case.num_input_tokens, 4 * (RANK + ROPE))
    with pytest.raises(NotImplementedError, match="argument 'cos_sin_cache'"):
        fx.backend.forward_extend(q, None, None, layer, fx.forward_batch, cos_sin_cache=q)
    layer.tp_k_head_num, layer.v_head_dim = 4, 128  # SGLang's un-absorbed attn_mha shape
    with pytest.raises(NotImplementedError, match="un-absorbed MHA prefill is not implemented"):
        fx.backend.forward_extend(q, None, None, layer, fx.forward_batch)
    with pytest.raises(UnsupportedForwardMode, match="DLLM_EXTEND"):
        fx.backend.init_forward_metadata(
            dataclasses.replace(fx.forward_batch, forward_mode=ForwardMode.DLLM_EXTEND)
        )


def test_pools_it_cannot_address_are_refused_by_name():
    fx = _fixture(CASES[0])
    pool = fx.runner.token_to_kv_pool
    pool.qk_rope_head_dim = 0
    with pytest.raises(UnsupportedKVPool, match="qk_rope_head_dim > 0"):
        AtomMLAAttnBackend(fx.runner)
    fx.runner.use_mla_backend = False
    with pytest.raises(ValueError, match="MHA/GQA models get AtomAttnBackend"):
        AtomMLAAttnBackend(fx.runner)
