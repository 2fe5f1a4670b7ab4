"""One streamed completion request, timed as vLLM's serving benchmark times it: the first event that
carries a choice is the first token; each later one's gap is an inter-token latency; the usage event (asked
for with stream_options.include_usage) gives the tokens the server generated."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass(slots=True)
class RequestTiming:
    """What one request measured; seconds, from the moment it was sent."""

    prompt_tokens: int
    success: bool = False
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between successive content events
    output_tokens: int = 0  # the server's usage count (the content events' count where it gives none)
    error: str = ""  # why it failed: the server's message, or the transport's

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None for a request of fewer than two tokens."""
        if self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def _message(data: object) -> str:
    """OpenAI's error.message (or a top-level message, or the whole thing) in one line."""
    detail = data.get("error", data) if isinstance(data, dict) else data
    text = detail.get("message", detail) if isinstance(detail, dict) else detail
    return " ".join(str(text).split())[:300]


def _error_message(status: int, body: bytes) -> str:
    """An error answer in one line: its status and message (the body's text where it is not JSON)."""
    text = body.decode(errors="replace")
    try:
        text = _message(json.loads(text))
    except ValueError:
        text = " ".join(text.split())[:300]
    return f"HTTP {status}: {text}"


async def stream_completion(client: httpx.AsyncClient, url: str, payload: dict) -> RequestTiming:
    """POST payload (a completions request; streaming and include_usage are set here) to url and time
    its events. Never raises for the server's or the network's failures: they are the timing's error."""
    prompt = payload["prompt"]
    timing = RequestTiming(prompt_tokens=len(prompt) if isinstance(prompt, list) else 0)
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    start = last = time.perf_counter()
    events = 0
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                timing.error = _error_message(response.status_code, await response.aread())
                return timing
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, comments
                data = line[5:].strip()
                if data == "[DONE]":
                    timing.success = True
                    break
                event = json.loads(data)
                now = time.perf_counter()
                if "error" in event:
                    timing.error = "error event: " + _message(event)
                    return timing
                if event.get("choices"):
                    if events == 0:
                        timing.ttft_s = now - start
                    else:
                        timing.itl_s.append(now - last)
                    events += 1
                    last = now
                if usage := event.get("usage"):
                    timing.output_tokens = usage.get("completion_tokens") or 0
                    timing.prompt_tokens = usage.get("prompt_tokens") or timing.prompt_tokens
    except (httpx.HTTPError, ValueError) as err:  # refused, reset, timed out; an event that is not JSON
        timing.error = f"{type(err).__name__}: {' '.join(str(err).split()) or 'no detail'}"
        return timing
    timing.latency_s = time.perf_counter() - start
    if not timing.success:
        timing.error = "the stream ended without [DONE]"
    elif timing.output_tokens == 0:
        timing.output_tokens = events  # a server that sends no usage: one token an event, at best
    return timing
