"""Constraints in the harmony format (GPT-OSS): a named function, tool_choice "required" and response_format
held to the answer's messages (harmony_grammar.py), not to its raw text.

The grammars against recorded answers, token by token through llguidance over a tokenizer with harmony's
markers: reasoning first is allowed, the constrained message must follow in its own header, and anything
else is refused. Then through the server with the official openai client, on a checkpoint whose greedy
choices are known (core_fixtures.harmony): the call is the named or one of the offered functions with
arguments that validate, read as tool_calls whole and streamed; a JSON schema holds the final message."""

import json

import jsonschema
import openai
import pytest
from core_fixtures.harmony import VOCAB, harmony_checkpoint
from core_fixtures.openai_client import chat_whole_and_streamed, streamed_calls
from transformers import AutoTokenizer

from atom_core.engine import LLMEngine
from atom_core.engine.async_engine import AsyncEngine
from atom_core.engine.config import EngineConfig
from atom_core.engine.structured.grammars import Grammars
from atom_core.engine.structured.params import StructuredOutputsParams
from atom_core.entrypoints.openai.app import create_app
from atom_core.entrypoints.openai.harmony_grammar import final_answer_grammar, tool_call_grammar
from atom_core.entrypoints.openai.tool_protocol import ToolDef

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
# (closed schemas: the checkpoint's greedy choices would fill an open object's keys with "c" forever)
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
TOOLS = [ToolDef.model_validate(WEATHER), ToolDef.model_validate(TIME)]
NEXT = "<|end|><|start|>assistant"
THINK = f"<|channel|>analysis<|message|>The user wants\nthe weather.{NEXT}"
CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo", "days": 2}<|call|>'
TIME_CALL = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>"
ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
FINAL = '<|channel|>final<|message|>{"answer": "no"}<|return|>'
MAYBE, DASH = FINAL.replace('"no"', '"maybe"'), "<|channel|>final<|message|>3-4"
BIG_DAYS, WIDE = CALL.replace('"days": 2', '"days": 12'), CALL.replace(", ", ",  ")


@pytest.fixture(scope="module")
def checkpoint(demo, tmp_path_factory):
    return harmony_checkpoint(demo, tmp_path_factory.mktemp("harmony"))


@pytest.fixture(scope="module")
def grammars(checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return tokenizer, Grammars.for_tokenizer(tokenizer, VOCAB)


def _walk(grammars, spec: StructuredOutputsParams, answer: str) -> str:
    """'complete', 'open' (allowed so far, not finished), or 'refused at N': N the answer's character
    where the token the grammar refused starts (the tokenizer decides where tokens start)."""
    tokenizer, compiled = grammars
    matcher = compiled.matcher(compiled.compile(spec), [])
    ids = tokenizer.encode(answer, add_special_tokens=False)
    for i, token in enumerate(ids):
        if not matcher.accept(token):
            return f"refused at {len(tokenizer.decode(ids[:i]))}"
    return "complete" if matcher.is_terminated() else "open"


def _refused_within(answer: str, part: str) -> str:
    """What _walk says of a refusal in the token holding part's first character of answer (the token may
    start a little before it)."""
    return f"refused within {answer.index(part)}"


def _check(walked: str, want: str, answer: str) -> None:
    if want.startswith("refused within"):
        at, limit = int(walked.removeprefix("refused at ")), int(want.removeprefix("refused within "))
        assert walked.startswith("refused at") and limit - 8 < at <= limit, (walked, answer[at : limit + 1])
    else:
        assert walked == want


@pytest.mark.parametrize(
    ("name", "answer", "walked"),
    [
        ("get_weather", THINK + CALL, "complete"),
        ("get_weather", THINK + THINK + CALL, "complete"),
        ("get_weather", CALL, "complete"),
        ("get_weather", TIME_CALL, _refused_within(TIME_CALL, "time")),  # not the function named
        ("get_weather", BIG_DAYS, _refused_within(BIG_DAYS, "2}")),  # past the schema's maximum
        ("get_weather", WIDE, _refused_within(WIDE, ' "days')),  # JSON laid out as the engine lays it out
        (None, TIME_CALL, "complete"),
        (None, THINK + CALL, "complete"),
        (None, FINAL, _refused_within(FINAL, "final")),  # required: a call
        (None, THINK, "open"),
    ],
)
def test_a_forced_call_is_a_commentary_message_after_any_reasoning(grammars, name, answer, walked):
    _check(_walk(grammars, tool_call_grammar(TOOLS, name), answer), walked, answer)


@pytest.mark.parametrize(
    ("asked", "tools", "answer", "walked"),
    [
        (StructuredOutputsParams(json=ANSWER), None, THINK + FINAL, "complete"),
        (StructuredOutputsParams(json=ANSWER), None, MAYBE, _refused_within(MAYBE, "maybe")),
        (StructuredOutputsParams(json=ANSWER), None, CALL, _refused_within(CALL, "commentary")),  # no tools
        (StructuredOutputsParams(json=ANSWER), TOOLS, CALL, "complete"),  # "auto": a call instead
        (
            StructuredOutputsParams(json_object=True),
            None,
            '<|channel|>final<|message|>{"x": [1]}<|return|>',
            "complete",
        ),
        (
            StructuredOutputsParams(regex=r"\d+/\d+"),
            None,
            "<|channel|>final<|message|>3/4<|return|>",
            "complete",
        ),
        (StructuredOutputsParams(regex=r"\d+/\d+"), None, DASH, _refused_within(DASH, "-")),
        (
            StructuredOutputsParams(choice=["yes", "no"]),
            None,
            "<|channel|>final<|message|>yes<|return|>",
            "complete",
        ),
    ],
)
def test_a_format_asked_holds_the_final_message(grammars, asked, tools, answer, walked):
    _check(_walk(grammars, final_answer_grammar(asked, tools), answer), walked, answer)


@pytest.fixture(scope="module")
def app(checkpoint):
    engine = LLMEngine(
        EngineConfig(model=str(checkpoint), device="cpu", kernel_backend="torch", num_kv_blocks=128)
    )
    async_engine = AsyncEngine(engine)
    yield create_app(async_engine, "atom-demo", reasoning_parser="harmony", tool_parser="harmony")
    async_engine.shutdown()
    engine.shutdown()


def _ask(app, **fields):
    ask = dict(
        model="atom-demo",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        temperature=0,
        max_tokens=80,
    )
    return chat_whole_and_streamed(app, ask, **fields)


@pytest.mark.parametrize(
    ("choice", "finish"),
    [({"type": "function", "function": {"name": "get_weather"}}, "stop"), ("required", "tool_calls")],
    ids=["named", "required"],
)
def test_forced_calls_through_the_server_whole_and_streamed(app, choice, finish):
    whole, events = _ask(app, tools=[WEATHER, TIME], tool_choice=choice)
    answer = whole.choices[0]
    assert answer.finish_reason == finish and answer.message.content is None
    (call,) = answer.message.tool_calls
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    assert choice == "required" or call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    assert streamed_calls(events) == [{"name": call.function.name, "arguments": call.function.arguments}]
    assert events[-1].choices[0].finish_reason == finish
    # content as the whole answer has it: none (the header tokens before the call give no "" pieces)
    assert [
        e.choices[0].delta.content for e in events[1:] if e.choices and e.choices[0].delta.content is not None
    ] == []


def test_a_json_schema_holds_the_final_answer_through_the_server(app):
    asked = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    whole, events = _ask(app, response_format=asked)
    answer = whole.choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    jsonschema.validate(json.loads(answer.message.content), ANSWER)
    assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == answer.message.content
    # with tools under "auto" the answer may call instead (this checkpoint prefers "c" of commentary)
    whole, _ = _ask(app, response_format=asked, tools=[WEATHER])
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_constraint_it_cannot_place_or_compile_is_refused_by_name(app):
    with pytest.raises(openai.BadRequestError, match="cannot be held to the harmony format's final message"):
        _ask(app, extra_body={"structured_outputs": {"grammar": 'root ::= "yes"'}})
    bad = {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "foo"}}}
    with pytest.raises(
        openai.BadRequestError,
        match=r"tool 'get_weather'\'s parameters schema is invalid: Invalid type: foo$",
    ):
        _ask(app, tools=[bad], tool_choice="required")
    with pytest.raises(openai.BadRequestError, match=r"the regex constraint is invalid: .*unclosed group$"):
        _ask(app, extra_body={"structured_outputs": {"regex": "a(b"}})


def test_reasoning_effort_reaches_the_chat_template_that_reads_it(app, checkpoint):
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)

    def prompt(effort: str) -> str:
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, reasoning_effort=effort
        )

    assert prompt("high").startswith("<|start|>system<|message|>Reasoning: high<|end|>")
    for effort, kwargs, used in [("high", None, "high"), ("low", {"reasoning_effort": "medium"}, "medium")]:
        whole, _ = _ask(
            app, reasoning_effort=effort, max_tokens=1, extra_body={"chat_template_kwargs": kwargs}
        )
        assert whole.usage.prompt_tokens == len(tokenizer(prompt(used), add_special_tokens=False).input_ids)
    plain, _ = _ask(app, max_tokens=1)
    assert plain.usage.prompt_tokens < whole.usage.prompt_tokens  # (no effort: no system line)
