"""Structured outputs on the random-weight demo model, whose text is noise: only the grammar's mask can
make it valid. Every answer that finishes (the grammar complete, then EOS) matches its constraint; rows
without one draw what they draw alone; a bad constraint is refused by name before it runs."""

import json
import re

import jsonschema
import pytest

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.structured import Grammars, StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},  # (xgrammar's bounded strings: control characters)
        "note": {"type": "string", "maxLength": 16},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["sea", "hills"]}, "maxItems": 3},
    },
    "required": ["city", "days", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["Plan a trip", "Where to?", "A long prompt about a journey somewhere warm and far away", "Go"]


@pytest.fixture(scope="module")
def llm(demo):
    with LLM(demo, device="cpu", kernel_backend="torch", num_kv_blocks=256, max_model_len=512) as llm:
        yield llm


def _answers(llm, spec, n=2, max_tokens=120, **fields):
    params = SamplingParams(
        n=n, temperature=1.0, seed=7, max_tokens=max_tokens, structured_outputs=spec, **fields
    )
    return [c for out in llm.generate(PROMPTS, params, use_tqdm=False) for c in out.outputs]


def test_json_schema_answers_that_finish_validate(llm):
    answers = _answers(llm, StructuredOutputsParams(json=SCHEMA))
    finished = [a for a in answers if a.finish_reason == "stop"]
    assert len(finished) >= len(answers) // 2  # (whitespace and strings are bounded: most finish)
    for a in finished:
        jsonschema.validate(json.loads(a.text), SCHEMA)  # strict JSON: no raw control characters
    for a in answers:
        assert a.finish_reason in ("stop", "length")


def test_json_object_regex_choice_and_grammar(llm):
    for a in _answers(llm, StructuredOutputsParams(json_object=True), n=1, max_tokens=60):
        if a.finish_reason == "stop":
            assert isinstance(json.loads(a.text), dict)
    for a in _answers(llm, StructuredOutputsParams(regex=r"[a-z]{3}-\d{2}(/[A-Z])?")):
        assert a.finish_reason == "stop" and re.fullmatch(r"[a-z]{3}-\d{2}(/[A-Z])?", a.text)
    choices = ["alpha", "beta", "gamma ray"]
    picked = {a.text for a in _answers(llm, StructuredOutputsParams(choice=choices))}
    assert picked <= set(choices) and picked
    for a in _answers(
        llm, StructuredOutputsParams(grammar='root ::= "(" [0-9]+ ("," [0-9]+)* ")"'), n=1, max_tokens=40
    ):
        assert a.finish_reason == "length" or re.fullmatch(r"\(\d+(,\d+)*\)", a.text)


def test_rows_without_a_grammar_draw_as_alone(llm):
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = llm.generate(PROMPTS[:2], plain, use_tqdm=False)
    engine = llm.engine
    for i, prompt in enumerate(PROMPTS[:2]):
        engine.add_request(prompt, plain, request_id=f"plain-{i}")
    engine.add_request(PROMPTS[2], SamplingParams(structured_outputs={"choice": ["x"]}), request_id="masked")
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert [done[f"plain-{i}"].outputs[0].token_ids for i in range(2)] == [
        o.outputs[0].token_ids for o in alone
    ]
    assert done["masked"].outputs[0].text == "x"


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            dict(regex="(open"),
            "the regex constraint is invalid: Regex parsing error at position 6: The parenthesis is not closed",
        ),
        (dict(json={"type": "nonsense"}), 'the json constraint is invalid: Unsupported type "nonsense"'),
        (dict(grammar="root ::= "), "the grammar constraint is invalid: EBNF parser error"),
        (
            dict(regex="a", choice=["b"]),
            r"exactly one of json, regex, choice, grammar, json_object \(got regex, choice\)",
        ),
        (dict(), r"\(got none\)"),
        (dict(choice=[]), "choice must be a non-empty list"),
        (dict(json="{not json"), "json schema is not valid JSON"),
    ],
)
def test_a_bad_constraint_is_refused_by_name(llm, spec, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["x"], SamplingParams(structured_outputs=spec), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_a_grammar_that_compiles_too_long_is_refused(llm):
    grammars = Grammars.for_tokenizer(llm.engine.tokenizer, llm.engine.model_config.vocab_size, timeout_s=0)
    deep = {
        "type": "object",
        "properties": {f"k{i}": {"type": "string", "pattern": "[a-z]{2,40}"} for i in range(40)},
    }
    with pytest.raises(ValueError, match="did not compile within 0 s"):
        grammars.compile(StructuredOutputsParams(json=deep))
    grammars.shutdown()
