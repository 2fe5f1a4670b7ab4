"""MTP speculative decoding for the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5), fp32 on the CPU.

The draft's logits equal an independent reference written from the published MTP description. Under
speculation the GDN layers keep their state after every verified token and the engine keeps the accepted
one, so speculative output equals plain output token for token: with the random draft's own proposals,
and with drafts forced by an oracle (Drafter.oracle) right for the first one a step, accepted exactly that
far (test_oracle_drafts.py forces drafts on Qwen3-Next always right, always wrong and right for the first
j, with chunked prefill, prefix hits and preemption).
"""

from collections import Counter

import pytest
import torch
from core_fixtures.drafts import draft_logits_in_two_forwards, forced, language_prompts, mtp, plain_tokens
from core_fixtures.references import torch_reference_ops

from atom_core.config import ConfigError, ModelConfig, ParallelConfig
from atom_core.engine import LLM, EngineConfig, SamplingParams
from atom_core.engine.execution.model_runner import ModelRunner
from tools.testing_qwen import VOCAB, qwen_mtp_checkpoint
from tools.testing_seams import record_steps


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops_on_the_cpu():
    """On the CPU every op runs its torch reference (see test_qwen3_next_parity.py); the kernels' step
    states meet their references in atom-kernels' test_gdn_step_states.py, and the GPU test below runs
    them under speculation through the verify CUDA graphs."""
    with torch_reference_ops():
        yield


# (on a GPU a test holds up to three of these engines at once, each asking for its share of the memory)
COMMON = dict(kernel_backend="torch", block_size=4, dtype="float32", gpu_memory_utilization=0.3)


@pytest.mark.parametrize(
    "case", ["qwen3-next", "qwen3.5", "qwen3.5-moe-fused", "qwen3.5-conditional-generation"]
)
def test_draft_logits_equal_the_reference_written_from_the_published_forward(tmp_path, case):
    main, reference = qwen_mtp_checkpoint(tmp_path, case)
    config = ModelConfig.from_pretrained(tmp_path)
    engine = EngineConfig(model=tmp_path, num_kv_blocks=32, speculative_config=mtp(1), **COMMON)
    runner = ModelRunner(config, engine, parallel=ParallelConfig(), device=torch.device("cpu"))
    tokens = language_prompts(VOCAB, [19])[0]
    got = draft_logits_in_two_forwards(runner, tokens, state_slot=0)
    with torch.no_grad():
        ids = torch.tensor([tokens])
        expected = reference(ids, main.model(ids).last_hidden_state)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * expected.abs().max().item())


def run(path, prompts, params, **engine):
    llm = LLM(path, **COMMON, **engine)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return llm.engine, outs


@pytest.mark.parametrize(
    "heads",
    [
        {},
        dict(linear_key_head_dim=24, linear_value_head_dim=40),
        dict(linear_key_head_dim=96, linear_value_head_dim=192),
    ],
    ids=["16-32", "24-40", "96-192"],
)
def test_random_and_forced_drafts_still_equal_plain(tmp_path, heads, monkeypatch):
    """Qwen3.5-MoE (fused experts), n=2, a prompt longer than the 64-token DeltaNet chunk: the random
    draft's own proposals (mostly rejected), and drafts forced right for the first of two, so that each
    step that verifies drafts accepts exactly one (its state committed) and rejects the rest. Also with
    DeltaNet heads that are not powers of two (the kernels pad them). The seam: the native layer hands
    every step to atom-core's gdn_step, verify steps with a slot for each token's state."""
    import atom_core.attention.gdn as native_gdn

    steps = record_steps([native_gdn], Counter(), monkeypatch.setattr)
    qwen_mtp_checkpoint(tmp_path, "qwen3.5-moe-fused", **heads)
    prompts = language_prompts(VOCAB, [11, 6, 66])
    params = SamplingParams(n=2, temperature=0, max_tokens=16, ignore_eos=True)
    _, want = run(tmp_path, prompts, params, num_kv_blocks=96)
    for oracle in (None, forced(plain_tokens(prompts, want), 1, VOCAB)):
        llm = LLM(tmp_path, **COMMON, num_kv_blocks=96, speculative_config=mtp(2))
        llm.engine.drafter.oracle = oracle
        got = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        assert [[o.token_ids for o in r.outputs] for r in got] == [
            [o.token_ids for o in r.outputs] for r in want
        ]
        stats, slots = llm.engine.stats, llm.engine.scheduler.state_slots
        assert stats.num_draft_tokens == sum(o.num_draft_tokens for r in got for o in r.outputs) > 0
        assert stats.num_accepted_tokens == sum(o.num_accepted_tokens for r in got for o in r.outputs)
        if oracle is not None:
            assert 0 < stats.num_accepted_tokens == stats.num_verifications < stats.num_draft_tokens
        assert slots.num_free == slots.num_slots  # all given back
    assert steps["gdn_step:GDNStepView"] > 0 and steps["gdn_step:GDNStepView+step_slots"] > 0


@pytest.fixture(scope="module")
def trained_qwen(tmp_path_factory):
    """A tiny Qwen3.5 whose target and MTP layer were trained together: drafts accepted and rejected."""
    path = tmp_path_factory.mktemp("qwen-mtp-trained")
    qwen_mtp_checkpoint(path, "qwen3.5", train_steps=TRAIN_STEPS)
    return path


TRAIN_STEPS = 200


@pytest.mark.parametrize("k", [1, 3])
def test_verifies_launched_ahead_start_from_the_accepted_state(trained_qwen, k):
    """Async scheduling under speculation on a hybrid (steps/speculative_ahead.py): each verify is
    launched before the one before it was read, starting each sequence from the state slot of that one's
    last accepted token, picked on the device (ahead_rows.commit_states). Greedy and seeded sampled
    requests (two samples, top-p) equal the synchronous verify's output and the plain engine's, with the
    same drafts and acceptances counted, drafts accepted and rejected, and every state slot given back."""
    prompts = language_prompts(VOCAB, [11, 6, 66, 23])
    params = [
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
        SamplingParams(n=2, temperature=0.8, top_p=0.9, seed=7, max_tokens=16, ignore_eos=True),
    ] * 2
    _, plain = run(trained_qwen, prompts, params, num_kv_blocks=96)
    runs = {
        ahead: run(
            trained_qwen, prompts, params, num_kv_blocks=96, speculative_config=mtp(k), async_scheduling=ahead
        )
        for ahead in (False, True)
    }
    want = [[o.token_ids for o in r.outputs] for r in plain]
    for engine, got in runs.values():
        assert [[o.token_ids for o in r.outputs] for r in got] == want
        assert engine.scheduler.state_slots.num_free == engine.scheduler.state_slots.num_slots
    (sync, _), (ahead, _) = runs[False], runs[True]
    counted = ("num_draft_tokens", "num_accepted_tokens", "num_verifications")
    assert [getattr(ahead.stats, c) for c in counted] == [getattr(sync.stats, c) for c in counted]
    assert 0 < ahead.stats.num_accepted_tokens < ahead.stats.num_draft_tokens
    assert sync.stats.num_async_steps == 0 < ahead.stats.num_async_steps


def test_mtp_on_a_hybrid_without_mtp_weights_is_refused(tmp_path):
    from tools.testing_qwen import qwen3_next_checkpoint

    qwen3_next_checkpoint(tmp_path, "qwen3-next")
    with pytest.raises(ValueError, match=r"no MTP layer tensors \(mtp\.\*\)"):
        LLM(tmp_path, **COMMON, num_kv_blocks=16, speculative_config=mtp(1))


def test_more_than_one_mtp_layer_is_refused(tmp_path):
    import json

    qwen_mtp_checkpoint(tmp_path, "qwen3-next")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 2}))
    with pytest.raises(ConfigError, match="declares 2 MTP layers: ATOM drafts with exactly one"):
        LLM(tmp_path, **COMMON, num_kv_blocks=16, speculative_config=mtp(1))


@pytest.mark.gpu(reason="CUDA graphs and the Triton GDN kernels need a GPU")
def test_speculative_equals_plain_through_the_verify_graphs_on_a_gpu(tmp_path):
    """fp32 on the GPU: verify steps replay CUDA graphs of k + 1 tokens a sequence, the Triton GDN kernels
    keeping each token's state; output is the plain engine's (itself replaying decode graphs), with drafts
    forced always right (k = 1) and right for the first of three (k = 3: the state after a partially
    accepted step is committed), accepted exactly as far as they are right."""
    qwen_mtp_checkpoint(tmp_path, "qwen3-next")
    prompts = language_prompts(VOCAB, [9, 70, 3, 14, 30, 17])
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    gpu = dict(dtype="float32", max_model_len=256, max_num_seqs=8, gpu_memory_utilization=0.3)
    plain_llm = LLM(tmp_path, **gpu)
    plain = plain_llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    want = [o.outputs[0].token_ids for o in plain]
    plain_llm.engine.shutdown()
    for k, right_for in ((1, None), (3, 1)):
        llm = LLM(tmp_path, **gpu, speculative_config=mtp(k))
        llm.engine.drafter.oracle = forced(plain_tokens(prompts, plain), right_for, VOCAB)
        got = [
            o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        ]
        stats = llm.engine.stats
        assert got == want
        assert llm.engine.runner.graphs.verify.replays > 0
        assert stats.num_draft_tokens > 0
        if right_for is None:
            assert stats.num_accepted_tokens == stats.num_draft_tokens
        else:
            assert stats.num_accepted_tokens == stats.num_verifications < stats.num_draft_tokens
        llm.engine.shutdown()
