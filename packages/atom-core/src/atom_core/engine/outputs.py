"""What generate() returns: the shape vLLM users know."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "abort", "error", or None while running
    logprobs: list[dict[int, float]] | None = None
    num_draft_tokens: int = 0  # speculative tokens proposed for this sample so far
    num_accepted_tokens: int = 0  # of those, accepted


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    error: str | None = None  # why the request failed (it is then finished; the engine goes on with others)
