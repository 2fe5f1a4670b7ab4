"""MTP speculative decoding in the native engine (DeepSeek-V3's MTP layer as the draft; GLM-4.5's in the
trained smoke test), fp32 on the CPU.

The draft's logits equal an independent reference written from the published MTP description. Speculative
output equals plain output token for token (greedy) on a checkpoint whose MTP layer was trained in the
test to predict well (a smoke test: how many drafts it gets right depends on the training's numerics, so
nothing is asserted of that), and, with drafts forced by an oracle (Drafter.oracle: always right, always
wrong, right for the first j; test_oracle_drafts.py has the exhaustive cases), exactly as far as the forced
drafts imply; sampled output has the plain output's distribution, and a seeded request's tokens are the
plain ones.
"""

import re
from collections import Counter

import pytest
import torch
from core_fixtures.checkpoints import deepseek_mtp_checkpoint, save_word_tokenizer
from core_fixtures.drafts import draft_logits_in_two_forwards, forced, language_prompts, mtp, plain_tokens
from core_fixtures.references import hf_main_hidden, torch_reference_ops

from atom_core.config import ConfigError, ModelConfig, ParallelConfig
from atom_core.engine import LLM, EngineConfig, SamplingParams
from atom_core.engine.execution.model_runner import ModelRunner
from tools.testing_models import transformers_mtp_logits
from tools.testing_seams import record_steps

VOCAB = 211


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops_on_the_cpu():
    """On the CPU every op of this file's engines runs its torch reference. The engine's kernel_backend
    reaches attention only; norms, rotary and MoE routing would run in Triton's interpreter over hundreds of
    rows (minutes). The kernels have their own tests, and the GPU test below runs them under speculation."""
    with torch_reference_ops():
        yield


# (on a GPU a test holds up to three of these engines at once, each asking for its share of the memory)
COMMON = dict(kernel_backend="torch", block_size=4, dtype="float32", gpu_memory_utilization=0.3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny DeepSeek-V3 whose target and MTP layer were trained together on successor_language."""
    path = tmp_path_factory.mktemp("mtp-trained")
    deepseek_mtp_checkpoint(path, train_steps=400)
    save_word_tokenizer(path, VOCAB)
    return path


@pytest.fixture(scope="module")
def trained_glm(tmp_path_factory):
    """A tiny GLM-4.5 whose target and MTP layer were trained together (its draft: DeepSeek's MTP structure
    around a GLM decoder layer, over paged MHA)."""
    path = tmp_path_factory.mktemp("glm-mtp-trained")
    deepseek_mtp_checkpoint(path, train_steps=400, family="glm-4.5")
    save_word_tokenizer(path, VOCAB)
    return path


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp-random")
    main, reference = deepseek_mtp_checkpoint(path)
    save_word_tokenizer(path, VOCAB)
    return path, main, reference


def test_draft_logits_equal_the_reference_written_from_the_published_forward(untrained):
    path, main, reference = untrained
    config = ModelConfig.from_pretrained(path)
    engine = EngineConfig(model=path, num_kv_blocks=32, speculative_config=mtp(1), **COMMON)
    runner = ModelRunner(config, engine, parallel=ParallelConfig(), device=torch.device("cpu"))
    tokens = language_prompts(VOCAB, [19])[0]
    got = draft_logits_in_two_forwards(runner, tokens, state_slot=-1)
    with torch.no_grad():
        ids = torch.tensor([tokens])
        hidden = hf_main_hidden(main, ids)
        expected = reference(ids, hidden)[0]
        published = transformers_mtp_logits(path, ids, hidden)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * expected.abs().max().item())
    torch.testing.assert_close(got, published, rtol=0, atol=1e-4 * published.abs().max().item())


def run(path, prompts, params, **engine):
    llm = LLM(path, **COMMON, **engine)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return llm.engine, outs


PROMPTS = [*language_prompts(VOCAB, [9, 23, 3, 14, 30])]
PROMPTS.append(PROMPTS[1][:20] + PROMPTS[0][:5])  # shares five blocks with prompt 1: prefix hits
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
# 17 blocks of 4 hold the longest sequence (50 tokens and 4 drafts) but not all six: some are preempted
# and recomputed whatever the drafts' acceptance (at 22 blocks, k = 4 accepted so much on one CPU that
# nothing was preempted)
TIGHT = dict(num_kv_blocks=17, max_num_batched_tokens=16, max_num_seqs=6)


@pytest.mark.parametrize("model", ["trained", "trained_glm"])
def test_a_trained_draft_speculates_as_plain_with_chunks_prefix_hits_and_preemption(request, model):
    """The smoke test of a draft that proposes its own argmax (a trained one: drafts accepted and
    rejected): output equals plain output, tokens and logprobs, through chunked prefill, prefix hits and
    preemption. How many drafts it gets right is the training's, so no rate is asserted; exact acceptance
    is test_oracle_drafts.py's."""
    trained = request.getfixturevalue(model)
    k = 3
    _, plain = run(trained, PROMPTS, GREEDY, **TIGHT)
    engine, spec = run(trained, PROMPTS, GREEDY, speculative_config=mtp(k), **TIGHT)
    for p, s in zip(plain, spec, strict=True):
        assert s.outputs[0].token_ids == p.outputs[0].token_ids
        for lp, ls in zip(p.outputs[0].logprobs, s.outputs[0].logprobs, strict=True):
            assert lp.keys() == ls.keys()
            assert max(abs(lp[t] - ls[t]) for t in lp) < 1e-4
    assert engine.scheduler.num_preemptions > 0 and engine.blocks.num_prefix_hits > 0
    assert engine.scheduler.num_chunked_prefills > 0
    stats = engine.stats
    drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
    assert drafted == sum(o.outputs[0].num_draft_tokens for o in spec) > 0
    assert accepted == sum(o.outputs[0].num_accepted_tokens for o in spec)
    assert 0 <= accepted <= drafted and 0 < stats.num_verifications <= drafted <= k * stats.num_verifications


AHEAD_PARAMS = [
    GREEDY,
    SamplingParams(n=2, temperature=0.8, top_p=0.95, seed=41, max_tokens=20, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0.7, top_k=20, min_p=0.05, seed=42, max_tokens=17, ignore_eos=True),
]


def assert_plain(plain, spec, mode) -> None:
    """spec's outputs are plain's: the same tokens, and logprobs over the same tokens within 1e-4."""
    for p, s in zip(plain, spec, strict=True):
        for po, so in zip(p.outputs, s.outputs, strict=True):
            assert so.token_ids == po.token_ids, (mode, s.request_id, so.index)
            for lp, ls in zip(po.logprobs or [], so.logprobs or [], strict=True):
                assert lp.keys() == ls.keys() and max(abs(lp[t] - ls[t]) for t in lp) < 1e-4


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("cache", ["roomy", "tight"])
def test_verifies_launched_ahead_equal_the_synchronous_ones(trained, k, cache):
    """Async scheduling under speculation (steps/speculative_ahead.py): each verify is launched before the
    one before it was read, its rows moved back on the device by that one's rejected drafts, its draws
    keyed at their true output positions. Greedy and seeded sampled requests (two samples, logprobs,
    top-p, top-k, min-p, max_tokens mid-step) give the synchronous verify's tokens and logprobs, which are
    the plain engine's; with a roomy cache the steps launch ahead and the drafts and acceptances counted
    are the synchronous ones; with a tight one (preemption, chunked prefills, fewer blocks than a verify
    and its chain need) the engine falls back to synchronous steps where it must, and output is the same."""
    engine = dict(num_kv_blocks=128) if cache == "roomy" else TIGHT
    params = [AHEAD_PARAMS[i % len(AHEAD_PARAMS)] for i in range(len(PROMPTS))]
    _, plain = run(trained, PROMPTS, params, **engine)
    runs = {
        mode: run(trained, PROMPTS, params, speculative_config=mtp(k), async_scheduling=mode, **engine)
        for mode in (False, True)
    }
    for mode, (_, spec) in runs.items():
        assert_plain(plain, spec, mode)
    (sync, _), (ahead, spec) = runs[False], runs[True]
    assert sync.stats.num_async_steps == 0 < ahead.stats.num_async_steps
    counted = ("num_draft_tokens", "num_accepted_tokens", "num_verifications")
    assert all(
        getattr(ahead.stats, c) == sum(getattr(o, c, 0) for r in spec for o in r.outputs) for c in counted[:2]
    )
    if cache == "roomy":
        assert [getattr(ahead.stats, c) for c in counted] == [getattr(sync.stats, c) for c in counted]
        assert ahead.stats.num_accepted_tokens > 0
    else:
        assert ahead.scheduler.num_preemptions > 0 and ahead.scheduler.num_chunked_prefills > 0


def arrivals(path, prompts, params, every: int, **engine):
    """Each request added `every` steps after the one before (while the others decode), run to the end:
    the engine and each request's output."""
    llm = LLM(path, **COMMON, **engine)
    core, outs, step = llm.engine, {}, 0
    while step // every < len(prompts) or core.has_unfinished_requests():
        if step % every == 0 and step // every < len(prompts):
            i = step // every
            core.add_request({"prompt_token_ids": prompts[i]}, params[i], request_id=str(i))
        for out in core.step():
            if out.finished:
                outs[out.request_id] = out
        step += 1
    core.steps_run = step
    return core, [outs[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("k", [1, 3])
def test_requests_arriving_prefill_beside_verifies_launched_ahead(trained, k, monkeypatch):
    """Requests that arrive while verifies run ahead of the host are admitted beside them (their prefill
    chunks in a forward of their own, the first token drawn on the device, their draft rows and chains
    after the verify's) instead of settling the verify in flight: greedy and seeded sampled requests (two
    samples, logprobs, top-k, min-p), prompts chunked by a small token budget, give the plain engine's
    tokens and logprobs, and no verify in flight is read early for them."""
    from atom_core.engine.steps.speculative_ahead import SpeculativeAhead  # (patched below)

    beside = Counter()
    run_prefills = SpeculativeAhead.run_prefills

    def counting(self, batch, runner):
        beside["steps"] += 1
        beside["chunks"] += sum(
            n < s.num_uncomputed for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
        )
        return run_prefills(self, batch, runner)

    continues, settled_for_prefills = SpeculativeAhead.continues, []

    def deciding(self):
        goes = continues(self)
        settled_for_prefills.append(not goes and self.verifiers_continue())
        return goes

    monkeypatch.setattr(SpeculativeAhead, "run_prefills", counting)
    monkeypatch.setattr(SpeculativeAhead, "continues", deciding)
    params = [AHEAD_PARAMS[i % len(AHEAD_PARAMS)] for i in range(len(PROMPTS))]
    engine = dict(num_kv_blocks=128, max_num_batched_tokens=12)
    _, plain = run(trained, PROMPTS, params, **engine)
    runs = {
        mode: arrivals(
            trained, PROMPTS, params, 3, speculative_config=mtp(k), async_scheduling=mode, **engine
        )
        for mode in (False, True)
    }
    for mode, (_, spec) in runs.items():
        assert_plain(plain, spec, mode)
    ahead, spec = runs[True]
    # (the two engines' steps differ, so the drafts a short budget cut differ: counters add up per request)
    for c in ("num_draft_tokens", "num_accepted_tokens"):
        assert getattr(ahead.stats, c) == sum(getattr(o, c) for r in spec for o in r.outputs) > 0
    assert beside["steps"] >= len(PROMPTS) - 1 and beside["chunks"] > 0  # every later arrival, chunked
    assert ahead.plan.prefills_ahead
    # no verify in flight was read early for a request arriving or prefilling: where one was, a verifying
    # sequence could not go on (fewer drafts near its max_tokens)
    assert settled_for_prefills and not any(settled_for_prefills)
    assert ahead.stats.num_async_steps > ahead.steps_run // 2


def test_stop_strings_and_n_under_forced_drafts(untrained, monkeypatch):
    """A stop string ends a request in the middle of what one verify step accepts (every draft right:
    four tokens a step), and where every draft is rejected: output, text and finish reason are the plain
    ones, for both samples of n=2. The seam: the native MLA layer hands every step to atom-core's
    mla_step."""
    import atom_core.attention.mla as native_mla

    steps = record_steps([native_mla], Counter(), monkeypatch.setattr)
    path = untrained[0]
    prompts = language_prompts(VOCAB, [11, 6])
    free = SamplingParams(n=2, temperature=0, max_tokens=30, ignore_eos=True)
    _, plain = run(path, prompts, free, num_kv_blocks=64)
    text = plain[0].outputs[0].text.split()
    stop = " ".join(text[5:7])  # output positions 5 and 6: the second verify step emits 5 to 8
    params = SamplingParams(n=2, temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    _, want = run(path, prompts, params, num_kv_blocks=64)
    assert want[0].outputs[0].finish_reason == "stop"
    for right_for in (None, 0):
        llm = LLM(path, **COMMON, num_kv_blocks=64, speculative_config=mtp(3))
        llm.engine.drafter.oracle = forced(plain_tokens(prompts, plain), right_for, VOCAB)
        got = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        for w, g in zip(want, got, strict=True):
            assert [(o.token_ids, o.text, o.finish_reason) for o in g.outputs] == [
                (o.token_ids, o.text, o.finish_reason) for o in w.outputs
            ]
        stats = llm.engine.stats
        assert stats.num_draft_tokens > 0
        assert stats.num_accepted_tokens == (stats.num_draft_tokens if right_for is None else 0)
    assert steps["mla_step"] > 0


def test_structured_outputs_are_refused_by_name_under_speculation(untrained):
    """Drafts are not checked against a grammar yet: such a request is refused before it runs."""
    llm = LLM(untrained[0], **COMMON, num_kv_blocks=64, speculative_config=mtp(2))
    params = SamplingParams(max_tokens=4, structured_outputs={"choice": ["a", "b"]})
    with pytest.raises(
        ValueError, match="structured outputs are not supported with speculative decoding yet"
    ):
        llm.generate([{"prompt_token_ids": [3, 4, 5]}], params)
    assert not llm.engine.has_unfinished_requests()


def test_penalized_requests_keep_their_penalties_and_are_not_drafted_for(untrained):
    prompts = language_prompts(VOCAB, [7, 12])
    penalized = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.8)
    _, plain = run(untrained[0], prompts, penalized, num_kv_blocks=64)
    engine, spec = run(untrained[0], prompts, penalized, num_kv_blocks=64, speculative_config=mtp(2))
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
    assert engine.stats.num_draft_tokens == 0
    unpenalized = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    _, free = run(untrained[0], prompts, unpenalized, num_kv_blocks=64)
    assert [o.outputs[0].token_ids for o in free] != [o.outputs[0].token_ids for o in plain]  # it matters


def test_prompt_logprobs_under_speculation_equal_plain_ones(trained):
    """A request that scores its prompt beside drafted ones: its scores, and every output, as without a
    draft (its prefill is chunked; it and the others are drafted for once they decode)."""
    scoring = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=2)
    engine_args = dict(num_kv_blocks=64, max_num_batched_tokens=16, async_scheduling=True)
    _, plain = run(trained, PROMPTS[:3], scoring, **engine_args)
    engine, spec = run(trained, PROMPTS[:3], scoring, speculative_config=mtp(2), **engine_args)
    assert engine.stats.num_draft_tokens > 0
    for p, s in zip(plain, spec, strict=True):
        assert s.outputs[0].token_ids == p.outputs[0].token_ids
        assert len(s.prompt_logprobs) == len(p.prompt_token_ids) and s.prompt_logprobs[0] is None
        for lp, ls in zip(p.prompt_logprobs[1:], s.prompt_logprobs[1:], strict=True):
            assert lp.keys() == ls.keys() and max(abs(lp[t] - ls[t]) for t in lp) < 1e-4


CHI2_0999 = {7: 24.32, 8: 26.12}  # the chi-square distribution's 99.9% points, by degrees of freedom


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's goodness of fit of counts [V] to probs [V] (cells with probability 0 must be empty)."""
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was emitted"
    expected = probs * counts.sum()
    live = probs > 0
    return float(((counts[live] - expected[live]) ** 2 / expected[live]).sum()), int(live.sum()) - 1


def _rejection_sampling_fits(accept_sampled, trials: int = 6000) -> tuple[list[tuple[float, int]], float]:
    """verify() on fixed target logits (3 rows: the last known token, drafts d1 and d2 of an 8-token
    vocabulary) once for each of `trials` seeds: the first emitted token must follow p0 exactly; after d1
    was kept, the next must follow p1; after d1 and d2, the bonus p2. Returns each fit's (chi2, dof), and
    how many standard errors the rate at which d1 was kept is from p0(d1)."""
    import atom_core.engine.speculation.verify as speculative
    from atom_core.engine.scheduling.sequence import Sequence

    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 8, generator=gen) * 0.7
    d1, d2 = 3, 5
    logits[0, d1] += 1.2  # the drafts are plausible: both paths (kept, rejected) are taken often
    logits[1, d2] += 1.2
    counts = torch.zeros(3, 8)
    original = speculative._accept_sampled
    speculative._accept_sampled = accept_sampled
    try:
        for trial in range(trials):  # a trial's randomness is its seed's: keyed by (seed, index, position)
            seq = Sequence("r", 0, [2], SamplingParams(temperature=0.9, seed=trial))
            tokens = speculative.verify(logits, [seq], [[d1, d2]]).tokens[0]
            for j, token in enumerate(tokens):
                counts[j, token] += 1
    finally:
        speculative._accept_sampled = original
    p = torch.softmax(logits / 0.9, dim=-1)
    kept, want = float(counts[0, d1]) / trials, float(p[0, d1])
    return [_chi_square(counts[j], p[j]) for j in range(3)], abs(kept - want) / (
        want * (1 - want) / trials
    ) ** 0.5


def test_rejection_sampling_emits_exactly_the_target_distribution():
    """The coupled draw is exact rejection sampling: each emitted position follows the target's
    distribution (chi-square below its 99.9% point) and a draft is kept at the rate p(draft) (within 4
    standard errors); a sampler that keeps every draft fails the same bound."""
    import atom_core.engine.speculation.verify as speculative
    from atom_core.engine.sampling.sampler import sample_token

    fits, kept = _rejection_sampling_fits(speculative._accept_sampled)
    for chi2, dof in fits:
        assert chi2 < CHI2_0999[dof]
    assert kept < 4

    def keep_every_draft(logits, draft, seq, drawn=None):
        return [*draft, sample_token(logits[-1], seq, len(seq.output_token_ids) + len(draft))]

    with pytest.raises(AssertionError, match=r"probability 0|chi2"):
        for chi2, dof in _rejection_sampling_fits(keep_every_draft)[0]:
            assert chi2 < CHI2_0999[dof], f"chi2 {chi2:.1f}"


def test_sampled_requests_speculate_reproducibly(tmp_path):
    """Sampled requests through the engine: a seeded request's 64 samples are plain sampling's with drafts
    forced right for the first of two (so each step that verifies drafts keeps exactly one and rejects
    the rest), and with the draft's own proposals (its draws are keyed by its seed, sample index and
    position only)."""
    deepseek_mtp_checkpoint(tmp_path, dict(vocab_size=8))
    prompt = [2, 5, 3]
    params = SamplingParams(n=64, temperature=1.0, max_tokens=6, ignore_eos=True, seed=3)
    plain = LLM(tmp_path, **COMMON).generate([{"prompt_token_ids": prompt}], params)
    want = [o.token_ids for o in plain[0].outputs]
    for oracle in (forced(plain_tokens([prompt], plain), 1, 8), None):
        llm = LLM(tmp_path, **COMMON, speculative_config=mtp(2))
        llm.engine.drafter.oracle = oracle
        out = llm.generate([{"prompt_token_ids": prompt}], params)[0]
        assert [o.token_ids for o in out.outputs] == want
        stats = llm.engine.stats
        if oracle is not None:
            assert 0 < stats.num_accepted_tokens == stats.num_verifications < stats.num_draft_tokens
            assert all(o.num_accepted_tokens > 0 for o in out.outputs)


SEEDED = [
    SamplingParams(temperature=0.8, top_p=0.95, seed=40 + i, max_tokens=20, ignore_eos=True)
    for i in range(len(PROMPTS))
]


def _count_dropped_drafts(engine) -> list[int]:
    """Counts, in the returned one-item list, the times a sequence with drafts was scheduled with fewer of
    them (short of KV blocks, or of the step's token budget)."""
    dropped, schedule = [0], engine.scheduler.schedule

    def counting():
        batch = schedule()
        dropped[0] += sum(
            len(d) < len(s.draft_token_ids) for s, d in zip(batch.seqs, batch.drafts, strict=True)
        )
        return batch

    engine.scheduler.schedule = counting
    return dropped


def test_a_seeded_sampled_request_is_the_same_with_and_without_speculation_and_beside_others(untrained):
    """Each sampled token is drawn with a uniform keyed by (seed, sample index, output position) alone: a
    seeded request (temperature 0.8, top-p 0.95) gives the tokens it gives alone without speculation with
    speculation too, and beside others under a KV cache so small that drafts are dropped and sequences
    preempted (where its draws used to depend on how many drafts each step verified). Drafts are forced
    right for the first of three: each step that verifies drafts keeps exactly one, rejects the rest."""
    path = untrained[0]

    def alone(oracle=None, **engine) -> list[list[int]]:
        llm = LLM(path, **COMMON, num_kv_blocks=64, **engine)
        if oracle is not None:
            llm.engine.drafter.oracle = oracle
        return [
            llm.generate({"prompt_token_ids": p}, s)[0].outputs[0].token_ids
            for p, s in zip(PROMPTS, SEEDED, strict=True)
        ]

    want = alone()
    oracle = forced({(tuple(p), 0): w for p, w in zip(PROMPTS, want, strict=True)}, 1, VOCAB)
    assert alone(oracle, speculative_config=mtp(3)) == want
    for spec in (None, mtp(3)):
        llm = LLM(path, **COMMON, **TIGHT, speculative_config=spec)
        if spec is not None:
            llm.engine.drafter.oracle = oracle
        dropped = _count_dropped_drafts(llm.engine)
        got = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], SEEDED)
        assert [o.outputs[0].token_ids for o in got] == want
        assert llm.engine.scheduler.num_preemptions > 0
    stats = llm.engine.stats
    assert dropped[0] > 0
    assert 0 < stats.num_accepted_tokens == stats.num_verifications < stats.num_draft_tokens


def test_atom_bench_reports_the_acceptance(untrained, capsys):
    import json

    from atom_core.cli import main

    spec = json.dumps(mtp(2))
    argv = [
        "bench",
        "--model",
        str(untrained[0]),
        "--speculative-config",
        spec,
        "--json",
        "--num-prompts",
        "3",
    ]
    argv += ["--input-len", "9", "--output-len", "7", "--kernel-backend", "torch", "--dtype", "float32"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["draft_tokens"] > 0 and 0 <= result["accepted_tokens"] <= result["draft_tokens"]
    assert result["acceptance_rate"] == result["accepted_tokens"] / result["draft_tokens"]
    assert 1 <= result["mean_accepted_length"] <= 3


@pytest.mark.parametrize(
    "value, message",
    [
        (mtp(0), "num_speculative_tokens must be an integer from 1 to 8, got 0"),
        (mtp(9), "from 1 to 8, got 9"),
        ({"method": "mtp", "num_speculative_tokens": "2"}, "got '2'"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "speculative method 'eagle' is not supported"),
        ({**mtp(1), "draft_tensor_parallel_size": 1}, "draft_tensor_parallel_size are not supported"),
        ("{not json", "speculative_config is not valid JSON"),
    ],
)
def test_bad_speculative_configs_are_refused_by_name(value, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(speculative_config=value)


def test_mtp_on_a_checkpoint_without_mtp_weights_is_refused(tmp_path, untrained):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from atom_core.models.weights import WeightLoadError

    no_layer = tmp_path / "no-layer"
    shutil.copytree(untrained[0], no_layer)
    config = json.loads((no_layer / "config.json").read_text())
    (no_layer / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    with pytest.raises(ConfigError, match=re.escape("has no MTP layer (num_nextn_predict_layers is 0)")):
        LLM(no_layer, **COMMON, num_kv_blocks=16, speculative_config=mtp(1))
    no_weights = tmp_path / "no-weights"
    shutil.copytree(untrained[0], no_weights)
    tensors = load_file(no_weights / "model.safetensors")
    save_file(
        {k: v for k, v in tensors.items() if not k.startswith("model.layers.3.")},
        no_weights / "model.safetensors",
    )
    with pytest.raises(WeightLoadError, match=re.escape("no MTP layer tensors (model.layers.3.*)")):
        LLM(no_weights, **COMMON, num_kv_blocks=16, speculative_config=mtp(1))
    v2 = tmp_path / "v2"
    (v2).mkdir()
    (v2 / "config.json").write_text(
        json.dumps({**config, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2"})
    )
    shutil.copy(untrained[0] / "model.safetensors", v2)
    with pytest.raises(ConfigError, match="DeepseekV2ForCausalLM has no MTP draft in ATOM"):
        LLM(v2, **COMMON, num_kv_blocks=16, speculative_config=mtp(1))


@pytest.mark.gpu(reason="CUDA graphs and the Triton MLA kernels need a GPU")
def test_speculative_equals_plain_through_the_verify_graphs_on_a_gpu(untrained):
    """fp32 on the GPU: the target's verify steps replay CUDA graphs of k + 1 tokens a sequence; output is
    the plain engine's (itself replaying decode graphs), with drafts forced always right (k = 1) and right
    for the first of three (k = 3), accepted exactly as far as they are right."""
    path = untrained[0]
    prompts = language_prompts(VOCAB, [9, 23, 3, 14, 30, 17])
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    gpu = dict(dtype="float32", max_model_len=128, max_num_seqs=8)
    plain_llm = LLM(path, **gpu)
    plain = plain_llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    want = [o.outputs[0].token_ids for o in plain]
    plain_llm.engine.shutdown()
    for k, right_for in ((1, None), (3, 1)):
        llm = LLM(path, **gpu, speculative_config=mtp(k))
        llm.engine.drafter.oracle = forced(plain_tokens(prompts, plain), right_for, VOCAB)
        got = [
            o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        ]
        runner, stats = llm.engine.runner, llm.engine.stats
        assert got == want
        assert runner.graphs.verify.replays > 0
        assert stats.num_draft_tokens > 0
        if right_for is None:
            assert stats.num_accepted_tokens == stats.num_draft_tokens
        else:
            assert stats.num_accepted_tokens == stats.num_verifications < stats.num_draft_tokens
        llm.engine.shutdown()


def test_verifies_launched_ahead_under_tensor_parallelism(trained):
    """TP=2 over gloo: every rank moves its rows back, feeds its next verify and counts acceptance from its
    own results (the message names what to use); output equals the one-process synchronous engine's."""
    params = [AHEAD_PARAMS[i % len(AHEAD_PARAMS)] for i in range(4)]
    sync, want = run(trained, PROMPTS[:4], params, num_kv_blocks=128, speculative_config=mtp(2))
    llm = LLM(
        trained,
        **COMMON,
        num_kv_blocks=128,
        speculative_config=mtp(2),
        async_scheduling=True,
        tensor_parallel_size=2,
        device="cpu",
    )
    try:
        got = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:4]], params)
        stats = llm.engine.stats
        assert [[o.token_ids for o in r.outputs] for r in got] == [
            [o.token_ids for o in r.outputs] for r in want
        ]
        assert stats.num_async_steps > 0 and stats.num_accepted_tokens == sync.stats.num_accepted_tokens > 0
    finally:
        llm.shutdown()


@pytest.mark.parametrize("ahead", [False, True], ids=["synchronous", "launched-ahead"])
def test_a_draft_failing_at_its_catch_up_ends_its_requests_and_later_ones_run(tmp_path, ahead):
    """The catch-up launched before the step is read (its rows fed the verify step's draws) fails: the
    step's tokens are still verified and emitted, then its requests fail with the draft model named, and
    a request after them runs to its end. Launched ahead (async scheduling), the verify in flight before
    it is read first."""
    deepseek_mtp_checkpoint(tmp_path)
    llm = LLM(tmp_path, **COMMON, speculative_config=mtp(2), async_scheduling=ahead)
    runner, failed = llm.engine.runner, []
    run_draft = runner.run_draft

    def failing(inputs, source):
        if inputs.source == "target" and inputs.fed_rows and not failed:  # the first early catch-up
            failed.append(len(inputs.query_lens))
            raise RuntimeError("a draft forward broke")
        return run_draft(inputs, source)

    runner.run_draft = failing
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:3]], greedy)
    assert failed == [3]
    assert all(o.finished and o.error and "draft model" in o.error for o in outs)
    after = llm.generate({"prompt_token_ids": PROMPTS[3]}, greedy)[0]
    assert after.error is None and len(after.outputs[0].token_ids) == 12
