"""The formats models write tool calls in, each read by the parser vLLM names for it: a call sits between
an open and a close tag, and its body gives the function's name and arguments.

- hermes: `<tool_call>{"name": "f", "arguments": {...}}</tool_call>` (Qwen3, Qwen2.5, Hermes, ...);
- qwen3_coder: `<tool_call><function=f><parameter=k>value</parameter>...</function></tool_call>`
  (Qwen3-Coder, Qwen3.5); a value is text, or JSON where the tool's schema types the parameter so;
- deepseek_v3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f` then the arguments in a
  json code block, `<｜tool▁call▁end｜>` ... `<｜tool▁calls▁end｜>` (DeepSeek-V3; V3.1's
  `<｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` too). The markers are tokens of DeepSeek's
  vocabulary that its tokenizer does not count as special, so they reach the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallFormat:
    open: str
    close: str
    # (the call's body, each function's parameters schema) -> {"name", "arguments": JSON text}, or None
    read: Callable[[str, dict[str, dict]], dict | None]
    wrap: tuple[str, ...] = ()  # markers around a run of calls: not content, and not read


def _hermes(body: str, schemas: dict[str, dict]) -> dict | None:
    try:
        data = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    return {
        "name": data["name"],
        "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
    }


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


def _qwen3_coder(body: str, schemas: dict[str, dict]) -> dict | None:
    found = _FUNCTION.search(body)
    if found is None:
        return None
    name = found.group(1).strip()
    types = (schemas.get(name) or {}).get("properties", {})
    args = {}
    for key, raw in _PARAMETER.findall(found.group(2)):
        value = raw.removeprefix("\n").removesuffix("\n")  # (the template puts each value on its own lines)
        args[key.strip()] = _typed(value, types.get(key.strip(), {}))
    return {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}


def _typed(value: str, schema: dict):
    """A parameter's text as its schema types it: text for strings (or untyped), else its JSON value."""
    kind = schema.get("type")
    if kind in (None, "string") or (isinstance(kind, list) and "string" in kind):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


_SEP = "<｜tool▁sep｜>"
_JSON_BLOCK = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.S)


def _deepseek_v3(body: str, schemas: dict[str, dict]) -> dict | None:
    head, sep, rest = body.partition(_SEP)
    if not sep:
        return None
    if head.strip() == "function":  # V3: the type, then the name and a json code block
        name, _, args = rest.partition("\n")
        block = _JSON_BLOCK.match(args)
        args = block.group(1) if block else args
    else:  # V3.1: the name, then the arguments
        name, args = head, rest
    try:
        parsed = json.loads(args)
    except ValueError:
        return None
    if not name.strip() or not isinstance(parsed, dict):
        return None
    return {"name": name.strip(), "arguments": json.dumps(parsed, ensure_ascii=False)}


FORMATS = {
    "hermes": CallFormat("<tool_call>", "</tool_call>", _hermes),
    "qwen3_coder": CallFormat("<tool_call>", "</tool_call>", _qwen3_coder),
    "deepseek_v3": CallFormat(
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        _deepseek_v3,
        wrap=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    ),
}
# how a chat template shows the format it asks for, most specific first
TEMPLATE_MARKS = (
    ("<|channel|>", "harmony"),  # (read with the answer's other messages: harmony.py)
    ("<function=", "qwen3_coder"),
    ("<｜tool▁call▁begin｜>", "deepseek_v3"),
    ("<tool_call>", "hermes"),
)


def template_parser(template: str | None) -> str | None:
    """The parser for a chat template's own call format (None: no format it knows)."""
    for mark, parser in TEMPLATE_MARKS:
        if template and mark in template:
            return parser
    return None
