"""How the engine benchmarks time LLM.generate: output tok/s, and a decode step (whole and forward alone)
from the difference of two generations; the copy bandwidth of the same run."""

from __future__ import annotations

import contextlib
import gc
import tempfile
import time
from collections.abc import Iterator

import torch
from transformers import PretrainedConfig

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.execution.step_inputs import prepare_step
from benchmarks.harness.routers import redraw_llm_routers

PROMPT, NEW = 512, 128


def prompts(vocab: int, batch: int) -> list[dict]:
    return [{"prompt_token_ids": torch.randint(0, vocab, (PROMPT,)).tolist()} for _ in range(batch)]


def tok_s(llm: LLM, vocab: int, batch: int) -> float:
    llm.generate(
        prompts(vocab, batch), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    )  # compile
    work = prompts(vocab, batch)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(work, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    torch.cuda.synchronize()
    return batch * NEW / (time.perf_counter() - start)


def step_ms(llm: LLM, vocab: int, batch: int, steps: int = 24) -> tuple[float, float]:
    """(engine.step() ms, the model forward alone ms) once batch sequences of PROMPT tokens decode."""
    engine = llm.engine
    for i, p in enumerate(prompts(vocab, batch)):
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True), f"s{i}")
    while any(s.num_computed_tokens < PROMPT for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(4):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    whole = (time.perf_counter() - start) / steps * 1e3
    inputs = prepare_step(engine.scheduler.schedule())  # the next step's forward, run alone
    for _ in range(3):
        engine.runner.run(inputs)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.runner.run(inputs)
    torch.cuda.synchronize()
    forward = (time.perf_counter() - start) / steps * 1e3
    for request_id in list(engine.requests):
        engine.abort(request_id)
    return whole, forward


@contextlib.contextmanager
def dummy_llm(config: PretrainedConfig, **engine) -> Iterator[LLM]:
    """config built in the engine with dummy bf16 weights (MoE routers re-drawn; engine: EngineConfig
    fields), shut down and its memory handed back on leaving."""
    with tempfile.TemporaryDirectory() as path:
        config.save_pretrained(path)
        llm = LLM(path, load_format="dummy", dtype="bfloat16", **engine)
        redraw_llm_routers(llm, config.hidden_size)  # dense models: only their biases zeroed
        try:
            yield llm
        finally:
            llm.shutdown()
            del llm
            gc.collect()
            torch.cuda.empty_cache()


def engine_step_times(config: PretrainedConfig, batches, steps: int) -> dict[int, tuple[float, float]]:
    """{batch: (whole step ms, forward ms)} of config built in the engine with dummy weights (MoE routers
    re-drawn), decoding after 512-token prompts."""
    engine = dict(max_model_len=512 + 160, max_num_seqs=64, max_num_batched_tokens=8192)
    with dummy_llm(config, **engine) as llm:
        return {b: step_ms(llm, config.vocab_size, b, steps=steps) for b in batches}
