"""A long prompt does not hold the token budget while others wait: the scheduler gives running prefills at
most half of it when a request is waiting, so a short request behind a long one starts within a step."""

import pytest

from atom_core.engine import EngineConfig, LLMEngine, OutputKind, SamplingParams

BUDGET = 64


@pytest.fixture(scope="module")
def engine(tiny_llama):
    _, path = tiny_llama(max_position_embeddings=2048)
    config = EngineConfig(
        model=path,
        kernel_backend="torch",
        block_size=4,
        num_kv_blocks=600,
        max_num_batched_tokens=BUDGET,
        max_model_len=2000,
    )
    return LLMEngine(config)


def _steps_until_first_token(engine: LLMEngine, short_id: str) -> int:
    for step in range(1, 100):
        for out in engine.step():
            if out.request_id == short_id and out.outputs[0].token_ids:
                return step
    raise AssertionError("the short request never produced a token")


def test_a_short_request_starts_within_a_step_of_a_long_prompts_prefill(engine):
    long_prompt = [(7 * i) % 150 + 1 for i in range(16 * BUDGET)]  # 16 steps of prefill alone
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, output_kind=OutputKind.DELTA)
    engine.add_request({"prompt_token_ids": long_prompt}, params, "long")
    engine.step()  # the long prompt is running, mid-prefill
    engine.add_request({"prompt_token_ids": [5, 6, 7]}, params, "short")
    assert _steps_until_first_token(engine, "short") == 1
    while engine.has_unfinished_requests():  # the long one still finishes
        engine.step()


def test_alone_a_prefill_takes_the_whole_budget(engine):
    before = engine.scheduler.num_chunked_prefills
    prompt = [(3 * i) % 150 + 1 for i in range(4 * BUDGET)]
    engine.add_request({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1, ignore_eos=True), "alone")
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    assert steps == 4  # 4 full-budget chunks, the last one sampling
    assert engine.scheduler.num_chunked_prefills - before == 1  # chunked once, at admission


def test_a_budget_of_one_token_still_finishes_every_prefill(tiny_llama):
    _, path = tiny_llama(max_position_embeddings=2048)
    config = EngineConfig(
        model=path, kernel_backend="torch", block_size=4, num_kv_blocks=64, max_num_batched_tokens=1
    )
    engine = LLMEngine(config)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for rid, prompt in (("a", [5, 6, 7]), ("b", [8, 9, 10, 11])):
        engine.add_request({"prompt_token_ids": prompt}, params, rid)
    for _ in range(50):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    assert not engine.has_unfinished_requests()
