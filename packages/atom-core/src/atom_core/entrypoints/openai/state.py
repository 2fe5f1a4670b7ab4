"""What the app serves, stored once on it (app.state.server), so that route handlers and middleware are
plain module functions rather than closures over create_app's arguments."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from atom_core.engine.async_engine import AsyncEngine


@dataclass(frozen=True, slots=True)
class ServerState:
    engine: AsyncEngine
    model_name: str  # the one model served; a request naming another gets 404
    api_key: str | None  # None: /v1 routes need no key
    closing: threading.Event = field(default_factory=threading.Event)  # set on shutdown: new requests 503


def server_state(request: HTTPConnection) -> ServerState:
    return request.app.state.server
