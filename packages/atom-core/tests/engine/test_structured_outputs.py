"""Structured outputs on the random-weight demo model, whose text is noise: only the grammar's mask can
make it valid. Every answer that finishes (its grammar complete) matches its constraint; rows without one
draw what they draw alone; a bad constraint is refused by name before it runs."""

import json
import re
import threading

import jsonschema
import pytest
import torch

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.structured import Grammars, StructuredOutputsParams
from atom_core.engine.structured.masking import apply_bitmask

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},  # bounded strings exclude raw control characters too
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
        # no free whitespace (a model cannot loop on it): json.dumps' layout, whatever the strings hold
        assert a.text == json.dumps(json.loads(a.text), ensure_ascii=False)
    for a in answers:
        assert a.finish_reason in ("stop", "length")


def test_json_object_regex_choice_and_grammar(llm):
    for a in _answers(llm, StructuredOutputsParams(json_object=True), n=1, max_tokens=60):
        if a.finish_reason == "stop":
            assert isinstance(json.loads(a.text), dict)
    # ([0-9], not \d: both dialects read \d as Unicode's digits, of a Unicode newer in llguidance than here)
    for a in _answers(llm, StructuredOutputsParams(regex=r"[a-z]{3}-[0-9]{2}(/[A-Z])?")):
        assert a.finish_reason == "stop" and re.fullmatch(r"[a-z]{3}-[0-9]{2}(/[A-Z])?", a.text)
    choices = ["alpha", "beta", "gamma ray"]
    picked = {a.text for a in _answers(llm, StructuredOutputsParams(choice=choices))}
    assert picked <= set(choices) and picked
    for a in _answers(
        llm, StructuredOutputsParams(grammar='root ::= "(" [0-9]+ ("," [0-9]+)* ")"'), n=1, max_tokens=40
    ):
        assert a.finish_reason == "length" or re.fullmatch(r"\(\d+(,\d+)*\)", a.text)


def test_a_constraint_that_ends_before_min_tokens_ends_the_answer(llm):
    """min_tokens bans the stop tokens a complete grammar allows alone: the grammar wins (its answer is
    whole), where before every token was masked and the request failed. Rows still open keep the ban."""
    choice = StructuredOutputsParams(choice=["yes", "no"])
    for a in _answers(llm, choice, min_tokens=30):
        assert a.finish_reason == "stop" and a.text in ("yes", "no")
    # a grammar that may go on: min_tokens holds it open (digits after digits) until it is met
    for a in _answers(llm, StructuredOutputsParams(regex=r"[0-9]+"), n=1, max_tokens=40, min_tokens=12):
        assert re.fullmatch("[0-9]+", a.text) and len(a.token_ids) >= 12, a


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
            r'the regex constraint is invalid: invalid regex "\(open" \(in regex\): regex parse error: unclosed group',
        ),
        (dict(json={"type": "nonsense"}), "the json constraint is invalid: Invalid type: nonsense"),
        (dict(grammar='root ::= "a" ('), r"the grammar constraint is invalid: .*Expected '\)' at line 1"),
        (dict(grammar="root ::= x"), "the grammar constraint is invalid: .*Rule 'x' not found"),
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


def test_a_grammar_that_compiles_too_long_is_refused_and_compiled_ones_are_kept(llm):
    """Compiling waits at most timeout_s (here a compile that would never end), on a thread of the
    compiler's, so the caller is free again; a constraint compiled once is not compiled again."""
    tokenizer, vocab = llm.engine.tokenizer, llm.engine.model_config.vocab_size
    grammars = Grammars.for_tokenizer(tokenizer, vocab, timeout_s=0.2)
    spec = StructuredOutputsParams(json={"type": "object", "properties": {"k": {"type": "integer"}}})
    compiled = grammars.compile(spec)
    release, calls = threading.Event(), []
    compile_once = grammars._compile
    grammars._compile = lambda s: calls.append(s) or (release.wait() and compile_once(s))
    assert grammars.compile(StructuredOutputsParams(json=dict(spec.json))) is compiled  # (an equal schema)
    with pytest.raises(ValueError, match=r"the regex constraint did not compile within 0.2 s: simplify it"):
        grammars.compile(StructuredOutputsParams(regex="[a-z]+"))
    assert len(calls) == 1
    release.set()
    grammars.shutdown()


def test_async_scheduling_launches_structured_steps_ahead_with_the_same_outputs(demo, llm):
    """Structured rows on the async path (steps/async_step.py): each step's forward is launched before the
    host has read the step before; the host then advances the grammars, fills the masks and queues the
    draw. Greedy and seeded rows, a choice that ends early beside schemas and a row without a grammar
    give the synchronous engine's outputs exactly."""
    specs = [SCHEMA, {"choice": ["alpha", "beta"]}, None, {"regex": "[a-z]{2,30}"}]
    params = [
        SamplingParams(
            n=2 if i % 2 else 1,
            temperature=0.0 if i == 0 else 1.0,
            seed=11 + i,
            max_tokens=40,
            structured_outputs=None if spec is None else (spec if "type" not in spec else {"json": spec}),
        )
        for i, spec in enumerate(specs)
    ]
    want = llm.generate(PROMPTS, params, use_tqdm=False)
    with LLM(demo, device="cpu", kernel_backend="torch", num_kv_blocks=256, max_model_len=512,
             async_scheduling=True) as ahead:  # fmt: skip
        got = ahead.generate(PROMPTS, params, use_tqdm=False)
        assert ahead.engine.stats.num_async_steps > 20
    assert [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in got] == [
        [(c.token_ids, c.finish_reason) for c in o.outputs] for o in want
    ]
    assert not llm.engine.stats.num_async_steps  # (the reference ran synchronously)


def test_the_bitmask_sets_exactly_the_unset_bits_of_the_chosen_rows_to_minus_infinity():
    """apply_bitmask against the definition, bit by bit: fresh random logits, masks and rows, a vocabulary
    that does not fill its last 32-bit word."""
    gen = torch.Generator().manual_seed(0)
    batch, vocab = 6, 70
    logits = torch.randn(batch, vocab, generator=gen)
    rows = torch.tensor([4, 1, 3])
    bitmask = torch.randint(
        -(2**31), 2**31, (len(rows), (vocab + 31) // 32), generator=gen, dtype=torch.int64
    )
    bitmask = bitmask.to(torch.int32)
    want = logits.clone()
    for i, row in enumerate(rows.tolist()):
        for t in range(vocab):
            if not (int(bitmask[i, t // 32]) >> (t % 32)) & 1:
                want[row, t] = float("-inf")
    apply_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, want)
    assert torch.isinf(want[rows]).any() and torch.isfinite(want[rows]).any()  # (both kinds of bit drawn)
