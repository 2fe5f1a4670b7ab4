"""OpenAI's tool fields in chat requests: the tools offered, tool_choice, and the calls an assistant made
(in the conversation sent back, answered by `tool` messages). Strict, as every request body here."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_TOOLS = 128
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionDef(_Strict):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments
    strict: bool | None = None  # (arguments are always held to parameters when the grammar writes them)


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class _Named(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: _Named


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


def tools_field() -> Any:
    return Field(default=None, max_length=MAX_TOOLS)
