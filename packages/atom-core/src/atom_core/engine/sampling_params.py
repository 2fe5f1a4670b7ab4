"""Sampling parameters, in the shape vLLM users know; invalid values raise ValueError naming the field."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Temperatures below this sample greedily (as vLLM does): dividing logits by less overflows fp32.
SAMPLING_EPS = 1e-5


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # below SAMPLING_EPS (0 included): greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: all tokens
    min_p: float = 0.0
    presence_penalty: float = 0.0  # subtracted once from each token the output already has (OpenAI, vLLM)
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # vLLM's: logits of prompt and output tokens divided (> 0) or multiplied
    seed: int | None = None
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # how many top logprobs to return with each token (0: only the sampled one)

    def __post_init__(self):
        _integers(self, "n", "top_k", "max_tokens")
        _integers(self, "seed", "logprobs", optional=True)
        _finite(
            self,
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        )
        checks = [
            (self.n >= 1, "n must be at least 1"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (0 < self.repetition_penalty <= 2, "repetition_penalty must be in (0, 2]"),
            (self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be between 0 and 20"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not all(isinstance(s, str) for s in self.stop or []):
            raise ValueError("stop must be a string or a list of strings")
        self.stop = [s for s in (self.stop or []) if s]
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be integers")

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _integers(params: SamplingParams, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(params, name)
        if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool)):
            continue
        raise ValueError(f"{name} must be an integer, got {value!r}")


def _finite(params: SamplingParams, *names: str) -> None:
    for name in names:
        value = getattr(params, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
