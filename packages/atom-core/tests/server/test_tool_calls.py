"""Tool calls: recorded hermes, qwen3_coder and deepseek_v3 answers read whole and in streamed pieces (the deltas join to the whole
answer's calls), the parser picked from the chat template's own format, and through the server with the
official openai client: a named function and "required" written by the grammar (arguments that validate,
even from the random demo model), "auto" refused without a parser and read with one, tool results sent
back through the template."""

import json

import jsonschema
import openai
import pytest
from core_fixtures.openai_client import chat_whole_and_streamed, streamed_calls

from atom_core.engine import LLMEngine
from atom_core.engine.async_engine import AsyncEngine
from atom_core.engine.config import EngineConfig
from atom_core.entrypoints.openai.app import create_app
from atom_core.entrypoints.openai.tool_calls import ToolPlan, ToolStream, read_calls
from atom_core.entrypoints.openai.tool_formats import template_parser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
RECORDED = [
    # (answer, content, [(name, arguments)])
    ("I will check.\n" + CALL, "I will check.\n", [("get_weather", {"city": "Paris", "days": 2})]),
    (CALL + "\n" + CALL.replace("Paris", "Oslo"), None, [("get_weather", {"city": "Paris", "days": 2})] * 1
     + [("get_weather", {"city": "Oslo", "days": 2})]),
    ("No tools needed: 4 < 5.", "No tools needed: 4 < 5.", []),
    (CALL[: -len("</tool_call>")], None, [("get_weather", {"city": "Paris", "days": 2})]),  # cut before the close
    ("<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
]  # fmt: skip
HERMES = ToolPlan("auto", parser="hermes")
XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    '<parameter=days>\n3\n</parameter>\n<parameter=units>\n{"temp": "C"}\n</parameter>\n</function>\n</tool_call>'
)
XML_ARGS = {"city": "New York", "days": 3, "units": {"temp": "C"}}
QWEN3_CODER = ToolPlan(
    "auto",
    parser="qwen3_coder",
    schemas={
        "get_weather": {
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "units": {"type": "object"},
            }
        }
    },
)
RECORDED_XML = [
    ("Checking.\n" + XML_CALL, "Checking.\n", [("get_weather", XML_ARGS)]),
    (XML_CALL + "\n" + XML_CALL, None, [("get_weather", XML_ARGS)] * 2),
    (XML_CALL.removesuffix("</function>\n</tool_call>"), None, [("get_weather", XML_ARGS)]),  # cut
    ("<tool_call>no function here</tool_call>", "<tool_call>no function here</tool_call>", []),
]

DS_CALL = (
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜>'
)
DS_V31_CALL = '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo", "days": 2}<｜tool▁call▁end｜>'
DEEPSEEK_V3 = ToolPlan("auto", parser="deepseek_v3")
PARIS, OSLO = ("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Oslo", "days": 2})
RECORDED_DS = [
    ("Let me look.\n<｜tool▁calls▁begin｜>" + DS_CALL + "<｜tool▁calls▁end｜>", "Let me look.\n", [PARIS]),
    ("<｜tool▁calls▁begin｜>" + DS_CALL + "\n" + DS_V31_CALL + "<｜tool▁calls▁end｜>", None, [PARIS, OSLO]),
    ("<｜tool▁calls▁begin｜>" + DS_CALL.removesuffix("<｜tool▁call▁end｜>"), None, [PARIS]),  # cut
    ("It is 4.", "It is 4.", []),
    (
        "<｜tool▁call▁begin｜>no separator<｜tool▁call▁end｜>",
        "<｜tool▁call▁begin｜>no separator<｜tool▁call▁end｜>",
        [],
    ),
]


def _calls(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(
    "plan, answer, content, calls",
    [(HERMES, *r) for r in RECORDED]
    + [(QWEN3_CODER, *r) for r in RECORDED_XML]
    + [(DEEPSEEK_V3, *r) for r in RECORDED_DS],
)
def test_recorded_answers_whole_and_streamed(plan, answer, content, calls):
    got_content, got_calls = read_calls(plan, answer)
    assert (got_content, _calls(got_calls)) == (content, calls)
    for size in (1, 2, 5, 9):
        stream, text, joined = ToolStream(plan), "", {}
        pieces = [answer[i : i + size] for i in range(0, len(answer), size)]
        for i, piece in enumerate(pieces):
            said, deltas = stream.feed(piece, final=i == len(pieces) - 1)
            text += said
            for d in deltas:  # OpenAI's deltas: the first of a call has its id and name, later ones add text
                joined.setdefault(d["index"], {"name": "", "arguments": ""})
                joined[d["index"]]["name"] += d.get("function", {}).get("name", "")
                joined[d["index"]]["arguments"] += d.get("function", {}).get("arguments", "")
        assert [(c["name"], json.loads(c["arguments"])) for c in joined.values()] == calls
        assert (text or None) == (content if calls else answer), size


def test_the_parser_follows_the_chat_templates_own_call_format():
    assert template_parser("{% if tools %}<tools>{{ tools }}</tools> ... <tool_call>{% endif %}") == "hermes"
    assert template_parser("<tool_call>\n<function={{ name }}>") == "qwen3_coder"  # Qwen3-Coder, Qwen3.5
    assert template_parser("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>") == "deepseek_v3"
    assert template_parser("{{ messages }}") is None and template_parser(None) is None


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def apps(demo):
    engine = LLMEngine(EngineConfig(model=str(demo), device="cpu", kernel_backend="torch", num_kv_blocks=128))
    async_engine = AsyncEngine(engine)
    yield create_app(async_engine, "atom-demo"), create_app(async_engine, "atom-demo", tool_parser="hermes")
    async_engine.shutdown()
    engine.shutdown()


def _ask(app, **fields):
    ask = dict(model="atom-demo", messages=[{"role": "user", "content": "Weather in Paris?"}], seed=5)
    return chat_whole_and_streamed(app, ask, **fields)


def _validated(call, tool):
    assert call["name"] == tool["function"]["name"]
    jsonschema.validate(json.loads(call["arguments"]), tool["function"]["parameters"])


def test_a_named_function_and_required_are_written_by_the_grammar(apps):
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole, events = _ask(apps[0], tools=[WEATHER, TIME], tool_choice=named, max_tokens=60)
    choice = whole.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None
    (call,) = choice.message.tool_calls
    _validated({"name": call.function.name, "arguments": call.function.arguments}, WEATHER)
    assert streamed_calls(events) == [{"name": "get_weather", "arguments": call.function.arguments}]

    whole, events = _ask(
        apps[0], tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, max_tokens=80
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = {
        "name": choice.message.tool_calls[0].function.name,
        "arguments": choice.message.tool_calls[0].function.arguments,
    }
    _validated(call, WEATHER if call["name"] == "get_weather" else TIME)
    assert streamed_calls(events) == [call] and events[-1].choices[0].finish_reason == "tool_calls"


def test_auto_is_refused_without_a_parser_and_read_with_one(apps):
    with pytest.raises(openai.BadRequestError, match='tool_choice "auto" needs a tool-call parser'):
        _ask(apps[0], tools=[WEATHER])
    # a regex makes the random model write a hermes call after a little content
    regex = r'Let me see\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[a-z]{3}", "days": [1-9]\}\}\n</tool_call>'
    whole, events = _ask(
        apps[1], tools=[WEATHER], max_tokens=200, extra_body={"structured_outputs": {"regex": regex}}
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me see.\n"
    (call,) = choice.message.tool_calls
    _validated({"name": call.function.name, "arguments": call.function.arguments}, WEATHER)
    assert streamed_calls(events) == [{"name": "get_weather", "arguments": call.function.arguments}]
    streamed = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert streamed == "Let me see.\n"


def test_tool_results_go_back_through_the_template_and_bad_choices_are_named(apps):
    conversation = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    whole, _ = _ask(apps[0], messages=conversation, tools=[WEATHER], tool_choice="none", max_tokens=5)
    assert whole.choices[0].message.content and not whole.choices[0].message.tool_calls
    for fields, message in [
        (
            dict(tool_choice={"type": "function", "function": {"name": "nope"}}, tools=[WEATHER]),
            "not among the tools",
        ),
        (dict(tool_choice="required"), "tool_choice 'required' needs tools"),
        (
            dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
            "both shape the answer",
        ),
        (dict(messages=[{"role": "tool", "content": "x"}]), "tool_call_id"),
        (dict(reasoning_effort="high"), "chat template reads no reasoning_effort variable"),
    ]:
        with pytest.raises(openai.BadRequestError, match=message):
            _ask(apps[0], **fields)


def test_a_parser_it_does_not_know_is_refused_before_the_app_observes_the_engine(demo):
    engine = LLMEngine(EngineConfig(model=str(demo), device="cpu", kernel_backend="torch", num_kv_blocks=16))
    async_engine = AsyncEngine(engine)
    try:
        with pytest.raises(ValueError, match="tool-call parser 'mistral' is not one of hermes, qwen3_coder"):
            create_app(async_engine, "atom-demo", tool_parser="mistral")
        assert engine.requests.observer is None  # (the metrics of an app never served)
    finally:
        async_engine.shutdown()
        engine.shutdown()
