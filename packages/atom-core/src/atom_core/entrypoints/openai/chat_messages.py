"""Chat messages as requests send them: text (or text parts: media are refused by name), a name, an
assistant's tool calls, a tool message's answer; and as chat templates read them."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from atom_core.entrypoints.openai.text_field import MAX_CONTENT_PARTS, Text
from atom_core.entrypoints.openai.tool_protocol import ToolCall


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: Text


MEDIA_PARTS = ("image_url", "image", "input_image", "video_url", "video", "input_audio", "audio_url")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # required; null (or left out) only beside an assistant's tool_calls
    content: Text | list[TextPart] | None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, sent back in the conversation
    tool_call_id: Text | None = None  # a tool message: the call it answers

    @model_validator(mode="before")
    @classmethod
    def _calls_need_no_content(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("tool_calls") and "content" not in data:
            return {**data, "content": None}
        return data

    @field_validator("content")
    @classmethod
    def _null_only_beside_calls(cls, content, info: ValidationInfo):
        if content is None and info.data.get("role") != "assistant":
            raise ValueError("null is allowed only for an assistant's message with tool_calls")
        return content

    @model_validator(mode="after")
    def _roles(self) -> ChatMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message carries tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    def for_template(self) -> dict[str, Any]:
        """As chat templates read a message: its text, and the calls' arguments as objects where they
        are JSON ones (Qwen's and DeepSeek's templates write them out again)."""
        out: dict[str, Any] = {"role": self.role, "content": None if self.content is None else self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": _args(c)}}
                for c in self.tool_calls
            ]
        return out

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        """Image, video or audio parts get their own 400 (served models are text-only, multimodal
        checkpoints included), not a schema mismatch."""
        parts = data.get("content") if isinstance(data, dict) else None
        if isinstance(parts, list) and len(parts) > MAX_CONTENT_PARTS:
            raise ValueError(f"content has {len(parts)} parts: at most {MAX_CONTENT_PARTS} are accepted")
        for part in parts if isinstance(parts, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in MEDIA_PARTS:
                raise ValueError(f"{kind} content is not supported: this server takes text only")
        return data

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


def _args(call: ToolCall) -> Any:
    try:
        parsed = json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments
    return parsed if isinstance(parsed, dict) else call.function.arguments
