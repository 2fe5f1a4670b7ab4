"""SamplingParams' vLLM fields beyond the sampling distribution: min_tokens (the stop tokens banned from
the draw, and stop strings not stopping, before that many tokens), include_stop_str_in_output,
and skip_special_tokens; the server maps them from a request (prompt_logprobs: test_prompt_logprobs.py)."""

import pytest

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.text.detokenizer import IncrementalDetokenizer
from atom_core.entrypoints.openai.protocol import CompletionRequest

CPU = dict(device="cpu", kernel_backend="torch", num_kv_blocks=64, max_model_len=256)
PROMPT = "The cache holds"


@pytest.fixture(scope="module")
def llm(demo):
    with LLM(demo, **CPU) as llm:
        yield llm


def _greedy(llm, **fields):
    params = SamplingParams(temperature=0, max_tokens=12, **fields)
    return llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]


def test_min_tokens_bans_the_stop_tokens_until_it_is_reached(llm):
    plain = _greedy(llm, ignore_eos=True)
    first = plain.token_ids[0]
    assert _greedy(llm, stop_token_ids=[first]).token_ids == [first]  # it stops at once without
    held = _greedy(llm, stop_token_ids=[first], min_tokens=4)
    assert first not in held.token_ids[:4] and len(held.token_ids) >= 4
    assert held.token_ids[0] != first  # the next best token was drawn instead
    if held.finish_reason == "stop":
        assert held.token_ids[-1] == first


def test_min_tokens_also_bans_eos_unless_ignored(llm):
    eos = llm.engine.eos_token_ids
    assert eos
    llm.engine.add_request(PROMPT, SamplingParams(min_tokens=2, stop_token_ids=[7]), request_id="m")
    llm.engine.add_request(PROMPT, SamplingParams(min_tokens=2, ignore_eos=True), request_id="i")
    banned = {r.request_id: r.seqs[0].min_tokens_stops for r in llm.engine.requests.values()}
    for rid in ("m", "i"):
        llm.engine.abort(rid)
    assert banned == {"m": frozenset({7, *eos}), "i": frozenset()}


def test_a_stop_string_stops_only_after_min_tokens_and_can_stay_in_the_text(llm):
    plain = _greedy(llm, ignore_eos=True)
    stop = plain.text[1:3]  # completed by the first token or two
    cut = _greedy(llm, stop=stop, ignore_eos=True)
    assert (cut.finish_reason, cut.text) == ("stop", plain.text[: plain.text.index(stop)])
    kept = _greedy(llm, stop=stop, ignore_eos=True, include_stop_str_in_output=True)
    assert (kept.finish_reason, kept.text) == ("stop", plain.text[: plain.text.index(stop) + len(stop)])
    late = _greedy(llm, stop=stop, ignore_eos=True, min_tokens=len(plain.token_ids))
    assert late.token_ids == plain.token_ids  # no stop before min_tokens; 12 tokens (the budget) made


def test_skip_special_tokens_false_keeps_them_in_the_text(demo):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo)
    ids = [*tokenizer.encode("hello", add_special_tokens=False), tokenizer.eos_token_id]
    assert IncrementalDetokenizer(tokenizer).update(ids, final=True) == "hello"
    kept = IncrementalDetokenizer(tokenizer, skip_special_tokens=False).update(ids, final=True)
    assert kept == "hello" + tokenizer.eos_token


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(min_tokens=20, max_tokens=10), r"^min_tokens must be between 0 and max_tokens$"),
        (dict(min_tokens=-1), r"^min_tokens must be between 0 and max_tokens$"),
        (dict(skip_special_tokens="no"), r"^skip_special_tokens must be true or false, got 'no'$"),
    ],
)
def test_bad_fields_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_the_server_takes_them_as_vllm_does():
    body = CompletionRequest(
        prompt="x", min_tokens=3, skip_special_tokens=False, include_stop_str_in_output=True, max_tokens=9
    )
    params = body.checked_params()
    assert (params.min_tokens, params.skip_special_tokens, params.include_stop_str_in_output) == (
        3,
        False,
        True,
    )
