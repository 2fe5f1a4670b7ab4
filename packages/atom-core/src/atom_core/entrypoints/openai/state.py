"""What the app serves, stored once on it (app.state.server), so that route handlers and middleware are
plain module functions rather than closures over create_app's arguments."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from atom_core.engine.async_engine import AsyncEngine
from atom_core.entrypoints.openai.harmony import HarmonyVocab
from atom_core.entrypoints.openai.metrics import ServingMetrics


@dataclass(frozen=True, slots=True)
class ServerState:
    engine: AsyncEngine
    model_name: str  # the name answers carry (the first served name)
    api_key: str | None  # None: /v1 routes need no key
    closing: threading.Event = field(default_factory=threading.Event)  # set on shutdown: new requests 503
    metrics: ServingMetrics | None = None  # /metrics
    served_names: tuple[str, ...] = ()  # every name a request may ask for (model_name first)
    reasoning_parser: str | None = None  # chat answers' <think> part as reasoning_content (reasoning.py)
    tool_parser: str | None = None  # how tool_choice "auto" answers' calls are read (tool_calls.py)
    harmony: HarmonyVocab | None = None  # chat answers in the harmony format: read from their tokens

    @property
    def names(self) -> tuple[str, ...]:
        return self.served_names or (self.model_name,)


def server_state(request: HTTPConnection) -> ServerState:
    return request.app.state.server
