"""Faults injected into a real engine: a request that fails inside a step fails alone; an engine that can no
longer run says so (health 503, EngineDead, `atom serve` exits 1) instead of hanging."""

import asyncio
import threading
import time

import httpx
import pytest
from core_fixtures.engine import drain_finished

from atom_core import EngineConfig, LLMEngine, SamplingParams
from atom_core.cli import main
from atom_core.engine.async_engine import AsyncEngine, EngineDead, RequestFailed
from atom_core.engine.execution.model_runner import ModelRunner
from atom_core.engine.execution.step_inputs import prepare_step
from atom_core.engine.steps import failures, pipeline
from atom_core.entrypoints.openai.app import create_app

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tiny_llama):
    return tiny_llama(max_position_embeddings=128)[1]


def _engine(path) -> LLMEngine:
    return LLMEngine(EngineConfig(path, kernel_backend="torch", block_size=4, num_kv_blocks=64))


PROMPTS = {"a": [5, 6, 7], "b": [9, 10, 11, 12, 13], "c": [20, 21]}


def _alone(path) -> dict:
    engine = _engine(path)
    for rid, p in PROMPTS.items():
        engine.add_request({"prompt_token_ids": p}, GREEDY, rid)
    return {rid: out.outputs[0].token_ids for rid, out in drain_finished(engine).items()}


def _poison(engine: LLMEngine, victim: str, monkeypatch, *, raise_in_forward: bool = False):
    """Make the runner's logits for `victim`'s rows NaN (or make any forward that includes it raise)."""
    run = engine.runner.run
    batch = {}

    def spy(scheduled):
        batch["now"] = scheduled  # the batch the next run() computes (a whole step's, or part of one)
        return prepare_step(scheduled)

    def poisoned(inputs, fed=None, behind=None):
        rows = [i for i, row in enumerate(inputs.ends) if batch["now"].seqs[row].request_id == victim]
        if rows and raise_in_forward:
            raise RuntimeError("injected fault")
        result = run(inputs, fed, behind)
        result.logits = result.logits.clone()
        result.logits[rows] = float("nan")
        return result

    for stage in (pipeline, failures):  # the step's own forward, and the reruns of its halves
        monkeypatch.setattr(stage, "prepare_step", spy)
    engine.runner.run = poisoned


def test_non_finite_logits_fail_only_their_request(checkpoint, monkeypatch):
    expected = _alone(checkpoint)
    engine = _engine(checkpoint)
    _poison(engine, "b", monkeypatch)
    for rid, p in PROMPTS.items():
        engine.add_request(
            {"prompt_token_ids": p},
            SamplingParams(temperature=0.7, seed=1, max_tokens=6) if rid == "b" else GREEDY,
            rid,
        )
    done = drain_finished(engine)
    assert "non-finite logits" in done["b"].error and done["b"].outputs[0].finish_reason == "error"
    assert {rid: done[rid].outputs[0].token_ids for rid in ("a", "c")} == {
        "a": expected["a"],
        "c": expected["c"],
    }
    assert engine.blocks.num_free_blocks == 64  # the failed request's blocks came back


def test_a_failed_forward_fails_its_batch_and_the_engine_goes_on(checkpoint, monkeypatch):
    expected = _alone(checkpoint)
    engine = _engine(checkpoint)
    _poison(engine, "b", monkeypatch, raise_in_forward=True)
    engine.add_request({"prompt_token_ids": PROMPTS["b"]}, GREEDY, "b")
    done = drain_finished(engine)
    assert "forward failed (RuntimeError" in done["b"].error  # the type for the client, the text in the log
    for rid in ("a", "c"):  # later requests run as if nothing happened
        engine.add_request({"prompt_token_ids": PROMPTS[rid]}, GREEDY, rid)
    done = drain_finished(engine)
    assert {rid: done[rid].outputs[0].token_ids for rid in ("a", "c")} == {
        "a": expected["a"],
        "c": expected["c"],
    }
    assert engine.stats.consecutive_failures == 0


def test_a_forward_that_fails_for_one_request_is_rerun_without_it(checkpoint, monkeypatch):
    expected = _alone(checkpoint)
    engine = _engine(checkpoint)
    _poison(engine, "b", monkeypatch, raise_in_forward=True)
    for round in range(AsyncEngine.MAX_FAILED_STEPS + 1):  # never counted as the engine's failures
        for rid, p in PROMPTS.items():  # one batch: b's forward raises whatever else it holds
            engine.add_request({"prompt_token_ids": p}, GREEDY, rid)
        done = drain_finished(engine)
        assert "forward failed (RuntimeError" in done["b"].error, round
        assert {rid: done[rid].outputs[0].token_ids for rid in ("a", "c")} == {
            "a": expected["a"],
            "c": expected["c"],
        }
        assert engine.stats.consecutive_failures == 0  # the engine ran: what failed was b's own
        assert engine.blocks.num_free_blocks == 64


def test_a_failed_step_launched_ahead_reads_the_one_in_flight_and_reruns_in_halves(checkpoint, monkeypatch):
    """b is admitted into a step launched while a's and c's decode is in flight, and its forward raises:
    the step in flight is read first, then the failed step's requests rerun in halves; only b fails."""
    expected = _alone(checkpoint)
    config = EngineConfig(
        checkpoint, kernel_backend="torch", block_size=4, num_kv_blocks=64, async_scheduling=True
    )
    engine = LLMEngine(config)
    _poison(engine, "b", monkeypatch, raise_in_forward=True)
    for rid in ("a", "c"):
        engine.add_request({"prompt_token_ids": PROMPTS[rid]}, GREEDY, rid)
    done = {}
    for _ in range(3):  # the prefill, then decodes launched ahead
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.pipeline.overlap.in_flight is not None
    engine.add_request({"prompt_token_ids": PROMPTS["b"]}, GREEDY, "b")
    done.update(drain_finished(engine))
    assert "forward failed (RuntimeError" in done["b"].error
    assert {rid: done[rid].outputs[0].token_ids for rid in ("a", "c")} == {
        "a": expected["a"],
        "c": expected["c"],
    }
    assert engine.stats.consecutive_failures == 0 and engine.stats.num_async_steps > 0
    assert engine.blocks.num_free_blocks == 64


def test_a_failing_request_of_several_samples_fails_once_and_alone(checkpoint, monkeypatch):
    expected = _alone(checkpoint)
    engine = _engine(checkpoint)
    _poison(engine, "b", monkeypatch, raise_in_forward=True)
    three = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=6, ignore_eos=True)
    engine.add_request({"prompt_token_ids": PROMPTS["b"]}, three, "b")  # alone: its samples fail together
    assert "forward failed" in drain_finished(engine)["b"].error
    assert engine.stats.consecutive_failures == 1  # one step failed, not one count per sample
    for rid, p in PROMPTS.items():  # beside others: its samples stay in one half
        engine.add_request({"prompt_token_ids": p}, three if rid == "b" else GREEDY, rid)
    done = drain_finished(engine)
    assert "forward failed" in done["b"].error
    assert {rid: done[rid].outputs[0].token_ids for rid in ("a", "c")} == {
        "a": expected["a"],
        "c": expected["c"],
    }
    assert engine.stats.consecutive_failures == 0
    assert engine.blocks.num_free_blocks == 64


def test_a_rejected_request_leaves_nothing_behind(checkpoint):
    engine = _engine(checkpoint)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request({"prompt_token_ids": [3] * 100}, SamplingParams(n=2, max_tokens=60))
    assert not engine.requests and not engine.scheduler.waiting
    # a seed far past 64 bits with n=2 (once a KeyError a step later) is a valid request
    engine.add_request({"prompt_token_ids": [3, 4]}, SamplingParams(n=2, seed=2**70, max_tokens=3), "s")
    assert len(drain_finished(engine)["s"].outputs) == 2


def test_an_engine_that_cannot_run_is_declared_dead_and_says_so(checkpoint):
    engine = _engine(checkpoint)
    engine.runner.run = lambda inputs, fed=None, behind=None: (_ for _ in ()).throw(
        RuntimeError("the device is gone")
    )
    died = threading.Event()
    async_engine = AsyncEngine(engine, on_dead=lambda reason: died.set())
    app = create_app(async_engine, "m")

    async def scenario():
        for i in range(AsyncEngine.MAX_FAILED_STEPS):
            with pytest.raises(RequestFailed, match="forward failed"):
                async for _ in async_engine.generate({"prompt_token_ids": [1, 2]}, GREEDY, f"r{i}"):
                    pass
        assert died.wait(5)
        with pytest.raises(EngineDead):
            async for _ in async_engine.generate({"prompt_token_ids": [1, 2]}, GREEDY, "late"):
                pass
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            health = await client.get("/health")
            r = await client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        return health, r

    try:
        health, r = asyncio.run(scenario())
    finally:
        async_engine.shutdown()
    assert health.status_code == 503 and "the engine is dead" in health.json()["error"]["message"]
    assert r.status_code == 503


def test_atom_serve_exits_non_zero_when_its_engine_dies(atom_cache, monkeypatch, a_free_port):
    monkeypatch.setattr(
        ModelRunner, "run", lambda self, inputs, fed=None: (_ for _ in ()).throw(RuntimeError("broken"))
    )
    port = a_free_port
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "rc",
            main(
                [
                    "serve",
                    "--port",
                    str(port),
                    "--device",
                    "cpu",
                    "--num-kv-blocks",
                    "64",
                    "--max-model-len",
                    "128",
                ]
            ),
        )
    )
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline and "rc" not in result:
        try:
            httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=5)
        except httpx.HTTPError:
            time.sleep(0.2)
    thread.join(timeout=30)
    assert result.get("rc") == 1
