"""What generate() returns: the shape vLLM users know."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class OutputKind(enum.Enum):
    """What a running request's outputs carry (SamplingParams.output_kind), as vLLM's RequestOutputKind."""

    CUMULATIVE = 0  # everything so far: text, token ids and logprobs from the first token
    DELTA = 1  # only what is new since the request's previous output
    FINAL_ONLY = 2  # no output until the request finishes, then the whole of it


@dataclass(slots=True)
class CompletionOutput:
    """One sample's output (with OutputKind.DELTA: text, token_ids and logprobs are the new part only)."""

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
    # SamplingParams.prompt_logprobs: per prompt token, None for the first, then {token: logprob} of the
    # prompt's token and the top ones (with OutputKind.DELTA, in the request's first output only)
    prompt_logprobs: list[dict[int, float] | None] | None = None
