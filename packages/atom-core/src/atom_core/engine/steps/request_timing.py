"""Per-request timing for metrics, as vLLM measures it: from the request's arrival in the engine to its
first output token (TTFT), between the steps that gave it new tokens (inter-token latency: one sample a
step, however many tokens a verify step accepted), and to its end (end-to-end latency). An observer
(e.g. the server's Prometheus metrics) is told as it happens; the engine keeps no history."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol


class RequestObserver(Protocol):
    """What a metrics sink is told, on the engine's thread (it must not block)."""

    def first_token(self, ttft_s: float, prompt_tokens: int) -> None: ...

    def new_tokens(self, count: int, since_last_s: float | None) -> None:
        """count tokens a step gave one request; since_last_s: the time since its previous ones (None for
        its first)."""

    def finished(self, reason: str, prompt_tokens: int, generation_tokens: int, e2e_s: float) -> None: ...


@dataclass(slots=True)
class RequestClock:
    arrival: float = field(default_factory=time.monotonic)
    last_token: float | None = None
    tokens_seen: int = 0

    def advance(self, observer: RequestObserver, generated: int, prompt_tokens: int) -> None:
        """After a step: tell the observer about the tokens (of all samples) generated since the last call."""
        if generated <= self.tokens_seen:
            return
        now = time.monotonic()
        if self.last_token is None:
            observer.first_token(now - self.arrival, prompt_tokens)
            observer.new_tokens(generated - self.tokens_seen, None)
        else:
            observer.new_tokens(generated - self.tokens_seen, now - self.last_token)
        self.last_token, self.tokens_seen = now, generated

    def end(self, observer: RequestObserver, reason: str, prompt_tokens: int, generated: int) -> None:
        observer.finished(reason, prompt_tokens, generated, time.monotonic() - self.arrival)
