"""The "atom" backend against SGLang's own attention test kit: its ModelRunner subclass, real
ReqToTokenPool/MHATokenToKVPool and ForwardBatch, RadixAttention, and the kit's reference attention."""

import dataclasses
import unittest
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit
from sglang_harness import padded_decode

from atom_sglang.attention.kv_cache import UnsupportedKVPool, pool_geometry
from atom_sglang.attention.metadata import UnsupportedForwardMode
from atom_sglang.plugin import register

CASES = (
    kit.make_dense_cases("atom")
    + kit.make_swa_no_prefix_input_config_cases("atom")
    + kit.make_swa_prefix_input_config_cases("atom")
)


@pytest.fixture(autouse=True)
def atom_registered():
    assert register()


def _fixture(case, layout="shuffled_pages"):
    with torch.no_grad():  # the kit fills the cache through parameters that require grad
        return kit.build_dense_attention_fixture(
            unittest.TestCase(), case, device="cpu", dtype=torch.float32, loc_layout=layout
        )


def _run(fx, batch=None, hidden=None):
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=fx.backend)):
        return fx.actual_module(fx.input_hidden if hidden is None else hidden, batch or fx.forward_batch)


@pytest.mark.parametrize("layout", ["shuffled_pages", "interleaved_pages"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_the_kits_reference(case, layout):
    fx = _fixture(case, layout)
    fx.backend.init_forward_metadata(fx.forward_batch)
    torch.testing.assert_close(_run(fx), kit.expected_dense_fixture_output(fx), atol=1e-5, rtol=1e-5)


def test_page_size_one_takes_any_slot_order():
    # With one-token pages a request's slots may be in any order, as SGLang's token allocator leaves them.
    [case] = [c for c in CASES if c.name == "mha_extend_page_size_1"]
    fx = _fixture(case, "non_monotonic_extend")
    fx.backend.init_forward_metadata(fx.forward_batch)
    torch.testing.assert_close(_run(fx), kit.expected_dense_fixture_output(fx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["mha_decode_page_boundary", "gqa_decode_page_boundary"])
def test_decode_graph_buffers_serve_capture_and_replay(name):
    [case] = [c for c in CASES if c.name == name]
    fx = _fixture(case)
    expected = kit.expected_dense_fixture_output(fx)
    fx.backend.init_cuda_graph_state(max_bs=8, max_num_tokens=8)
    # Capture on a padded batch, then replay: the metadata must view the same buffers both times.
    capture_batch, capture_hidden = padded_decode(fx, pad=8 - case.batch_size)
    fx.backend.init_forward_metadata_out_graph(capture_batch, in_capture=True)
    captured = fx.backend.forward_metadata.paged
    _run(fx, capture_batch, capture_hidden)
    replay_batch, replay_hidden = padded_decode(fx, pad=8 - case.batch_size)
    fx.backend.init_forward_metadata_out_graph(replay_batch)
    replayed = fx.backend.forward_metadata.paged
    for field in ("seq_lens", "block_tables", "slot_mapping", "cu_seqlens_q"):
        assert getattr(replayed, field).data_ptr() == getattr(captured, field).data_ptr(), field
    assert replayed.max_seq_len == captured.max_seq_len  # launch shapes do not depend on the batch
    out = _run(fx, replay_batch, replay_hidden)
    torch.testing.assert_close(out[: case.batch_size], expected, atol=1e-5, rtol=1e-5)


def _as_chain_verify(fx, topk: int = 1):
    """The fixture's extend batch, as SGLang's target-verify batch of the same draft tokens."""
    n = fx.case.extend_lens[0]
    spec = SimpleNamespace(topk=topk, num_tokens_per_req=n, draft_token_num=n, custom_mask=None)
    prefix = torch.tensor(fx.case.prefix_lens, dtype=torch.int32)
    return dataclasses.replace(
        fx.forward_batch,
        forward_mode=ForwardMode.TARGET_VERIFY,
        seq_lens=prefix,
        seq_lens_cpu=prefix,
        spec_info=spec,
    )


VERIFY = kit.DenseAttentionCase(
    name="verify",
    backend="atom",
    forward_mode=ForwardMode.EXTEND,
    num_heads=4,
    num_kv_heads=2,
    page_size=16,
    prefix_lens=(5, 15, 30),
    extend_lens=(3, 3, 3),
)


def test_chain_target_verify_equals_attending_the_drafts_causally():
    fx = _fixture(VERIFY)
    verify = _as_chain_verify(fx)
    fx.backend.init_forward_metadata(verify)
    torch.testing.assert_close(_run(fx, verify), kit.expected_dense_fixture_output(fx), atol=1e-5, rtol=1e-5)


def test_tree_verify_is_refused_by_name():
    fx = _fixture(VERIFY)
    with pytest.raises(UnsupportedForwardMode, match=r"chain drafts only .* got topk 2"):
        fx.backend.init_forward_metadata(_as_chain_verify(fx, topk=2))


@pytest.mark.parametrize("mode", [ForwardMode.DLLM_EXTEND, ForwardMode.SPLIT_PREFILL])
def test_modes_it_does_not_run_are_refused_by_name(mode):
    fx = _fixture(CASES[0])
    with pytest.raises(UnsupportedForwardMode, match=mode.name):
        fx.backend.init_forward_metadata(dataclasses.replace(fx.forward_batch, forward_mode=mode))


def test_attention_features_it_lacks_are_refused_by_name():
    fx = _fixture(CASES[0])
    fx.backend.init_forward_metadata(fx.forward_batch)
    q = torch.randn(fx.case.num_input_tokens, 4 * kit.DEFAULT_HEAD_DIM)
    attn = fx.actual_module.attn
    with pytest.raises(NotImplementedError, match="argument 'k_rope'"):
        fx.backend.forward_extend(q, q, q, attn, fx.forward_batch, k_rope=q)
    attn.is_cross_attention = True
    with pytest.raises(NotImplementedError, match=r"\(cross\)"):
        fx.backend.forward_extend(q, q, q, attn, fx.forward_batch)


def test_pools_it_cannot_address_are_refused_by_name():
    fx = _fixture(CASES[0])
    pool = fx.runner.token_to_kv_pool
    assert pool_geometry(pool).layout == "flash"
    pool.kv_cache_layout = "hnd"
    with pytest.raises(UnsupportedKVPool, match="not 'hnd'"):
        pool_geometry(pool)


@pytest.mark.parametrize("name", ["mha_extend_ragged_page_boundary", "gqa_decode_page_boundary"])
def test_an_fp8_pool_is_read_and_written_in_fp8(name):
    # SGLang's fp8 pool stores e4m3 bytes; the prefix goes in through SGLang's own set_kv_buffer, the new
    # tokens through atom-kernels' write. The kit's reference attends unquantized K/V: fp8's error bounds it.
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    [case] = [c for c in CASES if c.name == name]
    fx = _fixture(case)
    old = fx.runner.token_to_kv_pool
    fx.runner.token_to_kv_pool = MHATokenToKVPool(
        size=old.size,
        page_size=old.page_size,
        dtype=torch.float8_e4m3fn,
        head_num=old.head_num,
        head_dim=old.head_dim,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    fx.backend = type(fx.backend)(fx.runner)
    assert fx.backend.kv_cache_dtype == torch.float8_e4m3fn
    loc_fn = kit.make_loc_fn(
        "shuffled_pages",
        batch_size=case.batch_size,
        seq_lens=case.seq_lens,
        prefix_lens=case.prefix_lens,
        page_size=case.page_size,
        max_context_len=kit.DEFAULT_MAX_CONTEXT_LEN,
        seed=2026 + len(case.name) + case.num_kv_heads,
    )
    with torch.no_grad():
        kit._populate_prefix_kv(
            fx.actual_module,
            case,
            fx.runner,
            fx.prefix_hidden,
            max_context_len=kit.DEFAULT_MAX_CONTEXT_LEN,
            loc_fn=loc_fn,
        )
    fx.backend.init_forward_metadata(fx.forward_batch)
    expected = kit.expected_dense_fixture_output(fx)
    out = _run(fx)
    torch.testing.assert_close(out, expected, atol=0.1 * float(expected.abs().max()), rtol=0.1)
    assert not torch.equal(out, expected)  # it really went through fp8
