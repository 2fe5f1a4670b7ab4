"""Property tests: whatever a client sends, a request is either refused at validation (ValueError, so 400)
or runs to a normal finish inside a real engine; sampling never raises for parameters validation accepts."""

import math

import pytest
import torch
from core_fixtures.engine import drain_finished
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atom_core import EngineConfig, LLMEngine, SamplingParams
from atom_core.demo import ensure_demo_checkpoint
from atom_core.engine.sampling.sampler import sample
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.entrypoints.openai.protocol import CompletionRequest

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6),
    st.sampled_from([0, 1e-300, 1e-6, 1e300, -0.0, 2, 2.0000001]),
)
INTEGERS = st.one_of(st.integers(-(2**70), 2**70), st.integers(-3, 25))
OPTIONAL = {
    "temperature": NUMBERS,
    "top_p": NUMBERS,
    "top_k": INTEGERS,
    "min_p": NUMBERS,
    "presence_penalty": NUMBERS,
    "frequency_penalty": NUMBERS,
    "repetition_penalty": NUMBERS,
    "seed": st.one_of(st.none(), INTEGERS),
    "n": st.integers(-1, 20),
    "max_tokens": st.one_of(st.none(), st.integers(-2, 10), st.just(10**9)),
    "stop": st.one_of(st.none(), st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)),
    "stop_token_ids": st.one_of(st.none(), st.lists(INTEGERS, max_size=3)),
    "logprobs": st.one_of(st.none(), INTEGERS),
    "echo": st.booleans(),
    "ignore_eos": st.booleans(),
    "max_tokens_as_text": st.just("5"),
}
BODIES = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-5, 1200), max_size=24))},
    optional=OPTIONAL,
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATOM_CACHE_DIR", str(tmp_path_factory.mktemp("atom-cache")))
        path = ensure_demo_checkpoint(log=lambda _: None)
    return LLMEngine(
        EngineConfig(path, kernel_backend="torch", block_size=16, num_kv_blocks=16, max_model_len=64)
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODIES)
def test_no_accepted_request_fails_inside_the_engine(engine, body):
    if "max_tokens_as_text" in body:
        body["max_tokens"] = body.pop("max_tokens_as_text")
    try:
        request = CompletionRequest.model_validate(body)
        params = request.checked_params()
        prompt = {"prompt_token_ids": request.prompt} if isinstance(request.prompt, list) else request.prompt
        request_id = engine.add_request(prompt, params)
    except ValueError:  # pydantic's ValidationError included: the server answers 400
        assert not engine.requests, "a refused request must leave nothing in the engine"
        return
    out = drain_finished(engine)[request_id]
    assert out.error is None, out.error
    assert all(c.finish_reason in ("length", "stop") for c in out.outputs)


@settings(max_examples=200, deadline=None)
@given(
    temperature=st.one_of(st.just(0.0), st.floats(0, 1e300)),
    top_p=st.floats(1e-12, 1.0, exclude_min=False),
    top_k=st.one_of(st.just(-1), st.integers(1, 40)),
    min_p=st.floats(0, 1),
    penalties=st.tuples(
        st.floats(-2, 2),
        st.floats(-2, 2),
        st.one_of(st.floats(1e-3, 2), st.sampled_from([1e-30, 2.13e-151, 1e-300, 5e-324])),
    ),
    scale=st.sampled_from([1e-30, 1.0, 1e4, 1e30]),
    seed=st.integers(-(2**80), 2**80),
)
def test_sampling_never_raises_for_accepted_parameters(
    temperature, top_p, top_k, min_p, penalties, scale, seed
):
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        presence_penalty=penalties[0],
        frequency_penalty=penalties[1],
        repetition_penalty=penalties[2],
        logprobs=2,
    )
    gen = torch.Generator().manual_seed(seed % 2**63)
    logits = (torch.randn(2, 33, generator=gen, dtype=torch.float64) * scale).float()
    seqs = [Sequence("r", i, [1, 2, 3], params) for i in range(2)]
    seqs[1].append(5, None)
    result = sample(logits, seqs)
    assert result.errors == [None, None]
    assert all(isinstance(t, int) and 0 <= t < 33 for t in result.tokens)
    assert all(math.isfinite(v) and v >= -9999.0 for lp in result.logprobs for v in lp.values())


@pytest.mark.parametrize("penalty", [1e-30, 2.13e-151, 5e-324])
def test_a_tiny_repetition_penalty_is_its_limit_not_a_failure(penalty):
    """Dividing a seen token's positive logit by a penalty this small leaves fp32's range (and float64's at
    5e-324): the sampled token is the largest positive seen logit's, as the exact distribution has it to
    within any float's precision, where the row used to turn to NaN and fail."""
    logits = torch.tensor([[0.5, 3.0, 1.0, -1.0, 2.0, 9.0]])
    params = SamplingParams(temperature=1.0, seed=0, repetition_penalty=penalty, logprobs=1)
    seq = Sequence("r", 0, [1, 2, 3, 4], params)  # seen: 3.0, 1.0, -1.0 and 2.0; unseen 0.5 and 9.0
    result = sample(logits, [seq])
    assert result.errors == [None] and result.tokens == [1]
    assert result.logprobs[0][1] == 0.0
    greedy = SamplingParams(temperature=0, repetition_penalty=penalty)
    assert sample(logits, [Sequence("g", 0, [1, 2, 3, 4], greedy)]).tokens == [1]
