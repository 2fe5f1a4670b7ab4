"""Async scheduling (engine/steps/async_step.py): greedy decode steps launched before the host has read the
last step's tokens give exactly the synchronous engine's outputs, through admission, chunking, prefix
hits, preemption, stops, aborts, failures and mixed sampling."""

import pytest
import torch
from core_fixtures.engine import drain_finished

from atom_core import EngineConfig, LLMEngine, SamplingParams
from atom_core.config import ConfigError

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tiny_llama):
    return tiny_llama()[1]


def _engine(path, asynchronous: bool, **kw) -> LLMEngine:
    config = {"kernel_backend": "torch", "block_size": 4, "num_kv_blocks": 128, **kw}
    return LLMEngine(EngineConfig(path, async_scheduling=asynchronous, **config))


def _prompts() -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(5)
    shared = torch.randint(1, 151, (13,), generator=gen).tolist()
    return {
        "a": [*shared, 7, 8],  # shares 3 full blocks with b
        "b": [*shared, 9],
        "c": torch.randint(1, 151, (29,), generator=gen).tolist(),  # chunked under a 16-token budget
        "d": [4, 5],
        "e": [6],
    }


def _params() -> dict[str, SamplingParams]:
    return {
        "a": GREEDY,
        "b": SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),  # stops early: one dropped token
        "c": SamplingParams(temperature=0, max_tokens=9, n=2, ignore_eos=True),
        "d": GREEDY,
        "e": SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
    }


def _summary(done: dict) -> dict:
    return {rid: [(c.token_ids, c.finish_reason) for c in out.outputs] for rid, out in sorted(done.items())}


def _run(path, asynchronous: bool, **kw) -> tuple[dict, LLMEngine]:
    engine = _engine(path, asynchronous, **kw)
    for rid, p in _prompts().items():
        engine.add_request({"prompt_token_ids": p}, _params()[rid], rid)
    return _summary(drain_finished(engine)), engine


def test_async_equals_sync_through_chunking_prefix_hits_and_preemption(checkpoint):
    # roomy; then preempting; then a budget below the one-token rows (prompts' last tokens beside decodes)
    for kw in ({}, {"num_kv_blocks": 14, "max_num_batched_tokens": 16}, {"max_num_batched_tokens": 3}):
        expected, _ = _run(checkpoint, False, **kw)
        got, engine = _run(checkpoint, True, **kw)
        assert got == expected, kw
        assert engine.stats.num_async_steps > 0
        assert engine.blocks.num_free_blocks == kw.get("num_kv_blocks", 128)  # every block came back
        if "num_kv_blocks" in kw:
            assert engine.scheduler.num_preemptions > 0 and engine.scheduler.num_chunked_prefills > 0


def test_a_stop_token_hit_in_flight_drops_the_token_computed_after_it(checkpoint):
    (alone,), _ = _run_one(checkpoint, False, GREEDY)
    stop = alone[4]  # the fifth token: the step after it is already in flight when it is read
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop])
    (sync,), _ = _run_one(checkpoint, False, params)
    (got,), engine = _run_one(checkpoint, True, params)
    assert got == sync and got[-1] == stop and len(got) == alone.index(stop) + 1
    assert engine.stats.num_async_steps > 0 and not engine.scheduler.running


def _run_one(path, asynchronous: bool, params: SamplingParams):
    engine = _engine(path, asynchronous)
    engine.add_request({"prompt_token_ids": [3, 1, 4, 1, 5]}, params, "x")
    return [c.token_ids for c in drain_finished(engine)["x"].outputs], engine


def test_requests_arriving_and_aborted_while_a_step_is_in_flight(checkpoint):
    prompts = _prompts()
    alone = {rid: _run_one_prompt(checkpoint, prompts[rid]) for rid in ("a", "d")}
    engine = _engine(checkpoint, True)
    engine.add_request({"prompt_token_ids": prompts["a"]}, GREEDY, "a")
    engine.add_request({"prompt_token_ids": prompts["b"]}, GREEDY, "b")
    finished = {}
    for _ in range(4):  # prefill, then decode steps with one in flight
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.pipeline.overlap.in_flight is not None
    engine.abort("b")
    engine.add_request({"prompt_token_ids": prompts["d"]}, GREEDY, "d")  # waits: the flight settles first
    finished.update(drain_finished(engine))
    assert "b" not in finished
    assert {rid: finished[rid].outputs[0].token_ids for rid in ("a", "d")} == alone
    assert engine.blocks.num_free_blocks == 128 and engine.pipeline.overlap.in_flight is None


def _run_one_prompt(path, prompt: list[int]) -> list[int]:
    engine = _engine(path, False)
    engine.add_request({"prompt_token_ids": prompt}, GREEDY, "x")
    return drain_finished(engine)["x"].outputs[0].token_ids


def test_a_sampled_request_runs_the_batch_synchronously_and_reproduces(checkpoint):
    prompts = _prompts()
    sampled = SamplingParams(temperature=0.8, seed=7, max_tokens=8, ignore_eos=True)
    results = []
    for asynchronous in (False, True):
        engine = _engine(checkpoint, asynchronous)
        engine.add_request({"prompt_token_ids": prompts["a"]}, GREEDY, "g")
        engine.add_request({"prompt_token_ids": prompts["c"]}, sampled, "s")
        results.append((_summary(drain_finished(engine)), engine.stats.num_async_steps))
    (sync, _), (got, launched_ahead) = results
    assert got == sync
    assert launched_ahead > 0  # the greedy request went on ahead once the sampled one had finished


def test_non_finite_logits_in_flight_fail_only_their_request(checkpoint):
    prompts = _prompts()
    alone = {rid: _run_one_prompt(checkpoint, prompts[rid]) for rid in ("a", "d")}
    engine = _engine(checkpoint, True)
    forward, ahead = engine.runner._forward, []

    # NaN logits for b (row 1 of a, b, d) from its third step launched ahead on; from the forward, which
    # the runner's on-device argmax and finiteness check (greedy_tokens) then read
    def poisoned(inputs, sampled, lag):
        logits, hidden, ids = forward(inputs, sampled, lag)
        ahead.append(inputs.sampling is not None)
        if sum(ahead) >= 3 and inputs.sampling is not None and len(inputs.ends) == 3:
            logits = logits.clone()
            logits[1] = float("nan")
        return logits, hidden, ids

    engine.runner._forward = poisoned
    for rid in ("a", "b", "d"):
        engine.add_request({"prompt_token_ids": prompts[rid]}, GREEDY, rid)
    done = drain_finished(engine)
    assert "non-finite logits" in done["b"].error
    assert {rid: done[rid].outputs[0].token_ids for rid in ("a", "d")} == alone
    assert engine.blocks.num_free_blocks == 128 and engine.stats.num_async_steps > 0


def test_async_scheduling_is_on_for_cuda_by_default_and_validated(checkpoint):
    assert not EngineConfig(checkpoint, device="cpu").async_scheduling_on()
    assert EngineConfig(checkpoint, device="cpu", async_scheduling=True).async_scheduling_on()
    assert EngineConfig(checkpoint, device="cuda").async_scheduling_on()
    assert not EngineConfig(checkpoint, device="cuda", async_scheduling=False).async_scheduling_on()
    with pytest.raises(ConfigError, match="async_scheduling must be True, False or None, got 'yes'"):
        EngineConfig(checkpoint, async_scheduling="yes")


SAMPLED = {
    "a": SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=10, ignore_eos=True),
    "b": SamplingParams(temperature=1.3, top_k=5, min_p=0.05, seed=2**70, max_tokens=6, ignore_eos=True),
    "c": SamplingParams(temperature=0.7, n=2, seed=3, logprobs=2, max_tokens=9, ignore_eos=True),
    "d": SamplingParams(temperature=0, logprobs=0, max_tokens=12, ignore_eos=True),
    "e": SamplingParams(temperature=0.9, seed=11, max_tokens=1, ignore_eos=True),
}


def _with_logprobs(done: dict) -> dict:
    return {
        rid: [(c.token_ids, c.finish_reason, c.logprobs or []) for c in out.outputs]
        for rid, out in sorted(done.items())
    }


def _assert_same(got: dict, expected: dict) -> None:
    """Tokens and finish reasons exactly; logprobs' tokens exactly and values to 1e-5 (a step's batch
    differs by a row between the modes, a finished sequence's dropped token in flight, and its matmuls
    round in the last bit)."""
    assert {rid: [s[:2] for s in samples] for rid, samples in got.items()} == {
        rid: [s[:2] for s in samples] for rid, samples in expected.items()
    }
    for rid, samples in got.items():
        for (_, _, lps), (_, _, want) in zip(samples, expected[rid], strict=True):
            assert [d.keys() for d in lps] == [d.keys() for d in want], rid
            assert [list(d.values()) for d in lps] == [
                pytest.approx(list(d.values()), rel=1e-5) for d in want
            ]


def _staggered(path, asynchronous: bool, params: dict, **kw) -> tuple[dict, LLMEngine, int]:
    """The prompts arriving one every two steps (so requests wait and prefill beside running decodes);
    the outputs, the engine and how many steps ran."""
    engine = _engine(path, asynchronous, **kw)
    arriving = list(_prompts().items())
    done, steps = {}, 0
    while arriving or engine.has_unfinished_requests():
        if arriving and steps % 2 == 0:
            rid, prompt = arriving.pop(0)
            engine.add_request({"prompt_token_ids": prompt}, params[rid], rid)
        done.update({o.request_id: o for o in engine.step() if o.finished})
        steps += 1
    return _with_logprobs(done), engine, steps


def test_sampled_seeded_and_logprob_requests_arriving_over_time_launch_ahead_as_sync_runs(checkpoint):
    """Temperature, top-p, top-k, min-p, seeds and logprobs are sampled on the device: requests arriving
    while others decode prefill beside them, and nearly every step launches before the last is read."""
    for kw in ({}, {"num_kv_blocks": 14, "max_num_batched_tokens": 16}):  # roomy; then chunked and tight
        expected, _, _ = _staggered(checkpoint, False, SAMPLED, **kw)
        got, engine, steps = _staggered(checkpoint, True, SAMPLED, **kw)
        _assert_same(got, expected)
        assert all(len(lp) == len(tokens) > 0 for tokens, _, lp in got["c"] + got["d"])
        assert engine.blocks.num_free_blocks == kw.get("num_kv_blocks", 128)
        if not kw:  # every step but the first and the last settling ones overlaps the one before
            assert engine.stats.num_async_steps >= steps - 3, (engine.stats.num_async_steps, steps)


def test_a_penalized_request_settles_the_flight_and_runs_synchronously(checkpoint):
    penalized = dict(
        SAMPLED, b=SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=6, ignore_eos=True)
    )
    expected, _, _ = _staggered(checkpoint, False, penalized)
    got, engine, steps = _staggered(checkpoint, True, penalized)
    _assert_same(got, expected)
    assert 0 < engine.stats.num_async_steps < steps - 6  # overlapped before b came and after it finished
