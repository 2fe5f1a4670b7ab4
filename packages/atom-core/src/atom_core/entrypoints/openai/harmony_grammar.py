"""A chat request's constraint in the harmony format (GPT-OSS): one grammar over the answer's messages.

A harmony answer is a run of messages (harmony.py), so a constraint written for the answer's text would
hold the channel markers to it too and leave nothing the reader could take. Here the answer may reason
first (analysis messages, free text) and the constraint holds the message that counts:
- a named function or tool_choice "required": a commentary message addressed to that function (or to one
  of the tools) whose JSON body is its arguments, ended by `<|call|>`: one call an answer, as the model
  waits for the call's result before it goes on (parallel_tool_calls has no second call to allow);
- response_format / structured_outputs: the final message's body (json, json_object, regex or choice);
  with tools and tool_choice "auto" the answer may be a call instead.

Written as llguidance Lark: the markers are special tokens (`<|channel|>`...), which only those tokens
match; JSON bodies take the engine's JSON layout (no free whitespace, as every structured output here)."""

from __future__ import annotations

import json

from atom_core.engine.structured.grammars import JSON_LAYOUT, one_line_error
from atom_core.engine.structured.params import StructuredOutputsParams
from atom_core.entrypoints.openai.tool_protocol import ToolDef

# reasoning before the answer: any text (the markers are tokens, never text), then the next message's head
_ANALYSIS = (
    'analysis: <|channel|> "analysis" <|message|> REASONING <|end|> <|start|> "assistant"\n'
    "REASONING: /(.|\\n)*/\n"
)


def tool_call_grammar(tools: list[ToolDef], name: str | None) -> StructuredOutputsParams:
    """The answer reasons, then calls the function named (None: any of tools) with arguments that hold
    to its parameters schema."""
    offered = [t for t in tools if name is None or t.function.name == name]
    rules = _calls(offered)
    return StructuredOutputsParams(grammar="start: analysis* call\n" + rules + _ANALYSIS)


def final_answer_grammar(
    asked: StructuredOutputsParams, calls: list[ToolDef] | None = None
) -> StructuredOutputsParams:
    """The answer reasons, then its final message's body holds to `asked` (or, given tools the model may
    call, it calls one of them). ValueError for a constraint that cannot be placed in a message."""
    body = _body(asked)
    start = "start: analysis* (final | call)\n" + _calls(calls) if calls else "start: analysis* final\n"
    final = f'final: <|channel|> "final" <|message|> final_body <|return|>\nfinal_body: {body}\n'
    return StructuredOutputsParams(grammar=start + final + _ANALYSIS)


def _calls(tools: list[ToolDef]) -> str:
    """`call`: a commentary message to one of tools, its recipient after the channel as GPT-OSS writes it."""
    names = [f"call_{i}" for i in range(len(tools))]
    rules = [f"call: {' | '.join(names)}"]
    for rule, tool in zip(names, tools, strict=True):
        head = json.dumps(f"commentary to=functions.{tool.function.name} ")
        args = _json(tool.function.parameters, f"tool {tool.function.name!r}'s parameters schema")
        rules.append(f'{rule}: <|channel|> {head} <|constrain|> "json" <|message|> {args} <|call|>')
    return "\n".join(rules) + "\n"


def _json(schema: dict | None, what: str) -> str:
    """A JSON value held to schema, laid out as the engine lays out JSON; ValueError naming `what` for a
    schema llguidance refuses (checked alone: an error from the whole grammar would quote all of it)."""
    import llguidance

    laid_out = {**(schema or {"type": "object"}), "x-guidance": JSON_LAYOUT}
    _checked(llguidance.LLMatcher.grammar_from_json_schema(json.dumps(laid_out)), what)
    return "%json " + json.dumps(laid_out)


def _checked(grammar: str, what: str) -> None:
    import llguidance

    if error := llguidance.LLMatcher.validate_grammar(grammar):
        raise ValueError(f"structured outputs: {what} is invalid: {one_line_error(error)}")


def _body(asked: StructuredOutputsParams) -> str:
    if asked.json_object:
        return _json(None, "the json_object constraint")
    if asked.json is not None:
        return _json(
            json.loads(asked.json) if isinstance(asked.json, str) else asked.json, "the json constraint"
        )
    if asked.choice is not None:
        return " | ".join(json.dumps(c) for c in asked.choice)
    if asked.regex is not None:
        return _regex(asked.regex)
    raise ValueError(
        "a grammar (structured_outputs.grammar) cannot be held to the harmony format's final message: "
        "give json, json_object, regex or choice"
    )


def _regex(pattern: str) -> str:
    """The pattern as a Lark regex terminal, escaped as llguidance escapes its own regex grammars."""
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
    _checked(grammar, "the regex constraint")
    lark = json.loads(grammar)["grammars"][0]["lark_grammar"]
    return lark.removeprefix("start:").strip()
