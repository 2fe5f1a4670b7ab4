"""Tool calls in chat answers, as OpenAI gives them (`tool_calls`, streamed as deltas that join to the
whole answer's).

How the request's tool_choice shapes the answer:
- a named function, or "required": the grammar writes the call (the function's arguments schema, or an
  array of {name, parameters} over all tools, one item unless parallel_tool_calls), so even a weak model
  returns a valid call;
- "auto": the model writes calls in its chat template's own format, read by the tool-call parser for it
  (tool_formats.py); a template whose format has no parser here is refused by name rather than answered
  with unparsed calls;
- "none": the tools reach the template; nothing is parsed.
In the harmony format (GPT-OSS) calls are messages of the answer: a named or required choice's grammar
holds those messages (harmony_grammar.py), and harmony.py reads them in every mode.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from atom_core.engine.structured.params import StructuredOutputsParams
from atom_core.entrypoints.openai.harmony_grammar import tool_call_grammar
from atom_core.entrypoints.openai.reasoning import partial_tag
from atom_core.entrypoints.openai.tool_formats import FORMATS
from atom_core.entrypoints.openai.tool_protocol import NamedToolChoice, ToolDef

PARSERS = (*FORMATS, "harmony")  # harmony: calls are messages of the answer's format (harmony.py)


@dataclass(frozen=True, slots=True)
class ToolPlan:
    mode: str  # "named", "required", "auto" or "none"
    name: str | None = None  # the named function
    parser: str | None = None  # auto: how calls are read (tool_formats.py)
    schemas: dict[str, dict] | None = None  # auto: each function's parameters schema (typed values)


def tool_mode(tools: list[ToolDef] | None, choice) -> str:
    if choice is None:
        return "auto" if tools else "none"
    return "named" if isinstance(choice, NamedToolChoice) else choice


def tool_constraint(
    tools: list[ToolDef] | None, choice, parallel: bool, *, harmony: bool = False
) -> StructuredOutputsParams | None:
    """The grammar a named or required tool_choice puts on the answer (harmony: on the answer's messages,
    harmony_grammar.py); ValueError for a choice that names what is not there."""
    mode = tool_mode(tools, choice)
    if mode != "none" and not tools:
        raise ValueError(f"tool_choice {mode!r} needs tools")
    if mode == "named":
        found = [t for t in tools if t.function.name == choice.function.name]
        if not found:
            offered = ", ".join(t.function.name for t in tools)
            raise ValueError(
                f"tool_choice names {choice.function.name!r}, which is not among the tools ({offered})"
            )
        if harmony:
            return tool_call_grammar(tools, choice.function.name)
        return StructuredOutputsParams(json=_parameters(found[0]))
    if mode == "required" and harmony:
        return tool_call_grammar(tools, None)
    if mode == "required":
        items = [
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "parameters": _parameters(t)},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for t in tools
        ]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        return StructuredOutputsParams(json=schema if parallel else {**schema, "maxItems": 1})
    return None


def _parameters(tool: ToolDef) -> dict:
    return tool.function.parameters or {"type": "object"}


def tool_plan(tools, choice, parser: str | None) -> ToolPlan | None:
    """How the answer's calls are read (None: not at all); ValueError for "auto" without a parser."""
    mode = tool_mode(tools, choice)
    if mode == "none":
        return None
    if mode == "auto" and parser is None:
        raise ValueError(
            'tool_choice "auto" needs a tool-call parser for this model\'s call format, and there is none '
            '(--tool-call-parser; supported: hermes, qwen3_coder, deepseek_v3, harmony): use tool_choice "required" or a named function'
        )
    if parser == "harmony":  # calls are messages of the answer, read as such (harmony.py) in every mode
        return ToolPlan(mode, choice.function.name if mode == "named" else None, parser)
    if mode != "auto":
        return ToolPlan(mode, choice.function.name if mode == "named" else None)
    return ToolPlan(
        mode, parser=parser, schemas={t.function.name: t.function.parameters or {} for t in tools}
    )


def _call(name: str, arguments: str, index: int | None = None) -> dict:
    call = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return call if index is None else {"index": index, **call}


def read_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[dict]]:
    """A whole answer's (content, calls). Text that does not parse as calls stays content."""
    if plan.mode == "named":
        return None, [_call(plan.name, text)]
    if plan.mode == "required":
        try:
            items = json.loads(text)
            return None, [_call(i["name"], json.dumps(i["parameters"])) for i in items]
        except (ValueError, TypeError, KeyError):
            return text, []  # (cut by max_tokens)
    stream = ToolStream(plan)
    content, deltas = stream.feed(text, final=True)
    return (content or None) if deltas else text, [
        {k: v for k, v in d.items() if k != "index"} for d in deltas
    ]


class ToolStream:
    """One streamed choice's calls: feed() its text pieces; returns the content piece and the tool_calls
    deltas (OpenAI's: the first of a call carries its index, id, type and name)."""

    def __init__(self, plan: ToolPlan):
        self.plan, self.calls, self.buffer, self.inside, self.held = plan, 0, "", False, ""

    def feed(self, text: str, final: bool) -> tuple[str, list[dict]]:
        if self.plan.mode == "named":
            if not text:
                return "", []
            if self.calls == 0:
                self.calls = 1
                return "", [_call(self.plan.name, text, index=0)]
            return "", [{"index": 0, "function": {"arguments": text}}]
        if self.plan.mode == "required":
            self.buffer += text
            if not final:
                return "", []
            content, calls = read_calls(self.plan, self.buffer)
            self.calls = len(calls)
            return content or "", [{"index": i, **c} for i, c in enumerate(calls)]
        return self._read(text, final)

    def _read(self, text: str, final: bool) -> tuple[str, list[dict]]:
        fmt = FORMATS[self.plan.parser]
        buf, self.held = self.held + text, ""
        content, deltas = "", []
        while buf:
            if not self.inside:
                at = buf.find(fmt.open)
                if at < 0:
                    keep = 0 if final else max(partial_tag(buf, tag) for tag in (fmt.open, *fmt.wrap))
                    content, self.held, buf = content + buf[: len(buf) - keep], buf[len(buf) - keep :], ""
                    break
                content += buf[:at]
                buf, self.inside = buf[at + len(fmt.open) :], True
            self.buffer += buf  # (the close tag may span pieces: looked for in all of the call so far)
            at = self.buffer.find(fmt.close)
            if at < 0:
                buf = ""
                break
            if not self._emit(self.buffer[:at], deltas):  # not a call after all: its text is content
                content += fmt.open + self.buffer[: at + len(fmt.close)]
            buf, self.buffer, self.inside = self.buffer[at + len(fmt.close) :], "", False
        if final and self.inside:  # an unclosed call: a call if it reads as one, else content
            if not self._emit(self.buffer, deltas):
                content += fmt.open + self.buffer
            self.buffer, self.inside = "", False
        for tag in fmt.wrap:  # (held above until whole, so never split across pieces)
            content = content.replace(tag, "")
        if self.calls or deltas:  # (whitespace between and after calls is not content)
            content = content.strip() and content
        return content, deltas

    def _emit(self, body: str, deltas: list[dict]) -> bool:
        call = FORMATS[self.plan.parser].read(body, self.plan.schemas or {})
        if call is None:
            return False
        deltas.append(_call(call["name"], call["arguments"], index=self.calls))
        self.calls += 1
        return True
