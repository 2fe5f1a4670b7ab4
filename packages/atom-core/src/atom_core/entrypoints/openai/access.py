"""Who may call, and the access log: one middleware that refuses new requests while the server shuts down
(503), checks the API key on /v1 routes, and logs one line per request (method, path, status, time),
refusals included."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable

from fastapi import Request, Response

from atom_core.entrypoints.openai.errors import error_response
from atom_core.entrypoints.openai.state import server_state

logger = logging.getLogger("atom.server")


def authorized(header: str | None, api_key: str) -> bool:
    """`Authorization: Bearer <key>` (the scheme in any case), compared in constant time."""
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


async def auth_and_log(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    start = time.perf_counter()
    state = server_state(request)
    api_key = state.api_key
    if state.closing.is_set():  # in-flight requests finish; nothing new starts
        response: Response = error_response(503, "the server is shutting down", "service_unavailable")
    elif (
        api_key
        and request.url.path.startswith("/v1")
        and not authorized(request.headers.get("authorization"), api_key)
    ):
        response = error_response(401, "invalid or missing API key", "authentication_error")
    else:
        response = await call_next(request)
    logger.info(
        "%s %s -> %d in %.1f ms",
        request.method,
        request.url.path,
        response.status_code,
        (time.perf_counter() - start) * 1e3,
    )
    return response
