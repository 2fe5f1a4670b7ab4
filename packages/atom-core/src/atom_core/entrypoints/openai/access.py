"""Who may call, and the access log: one middleware that refuses new requests while the server shuts down
(503), checks the API key on /v1 routes, and logs one line per request, refusals included: client,
method, path, status, the prompt and completion tokens a generation counted, and the time until its
last byte was sent.

The line is written when the response's body ends, not when it starts: a stream's status line says 200
when its first byte goes out, so a stream that ends in an error event logs that error's status (the
route records it), and one whose client left logs 499, as a whole answer's does."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request, Response

from atom_core.entrypoints.openai.errors import error_response
from atom_core.entrypoints.openai.state import server_state

logger = logging.getLogger("atom.server")
CLIENT_LEFT = 499  # nginx's status for a client that closed the connection before its answer ended


@dataclass
class AccessRecord:
    """What a request's access line reports beyond its response's status, filled in by its route."""

    status: int | None = None  # how a stream ended, where not as its first byte said (an error event)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def tokens(self, prompt: int, completion: int) -> None:
        self.prompt_tokens, self.completion_tokens = prompt, completion


def access_record(request: Request) -> AccessRecord:
    """The request's record (a fresh one where no middleware made one, as in a route called alone)."""
    record = getattr(request.state, "access", None)
    if record is None:
        record = request.state.access = AccessRecord()
    return record


def authorized(header: str | None, api_key: str) -> bool:
    """`Authorization: Bearer <key>` (the scheme in any case), compared in constant time."""
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


async def auth_and_log(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    start = time.perf_counter()
    state = server_state(request)
    record = access_record(request)
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
    body = getattr(response, "body_iterator", None)
    if body is None:  # answered here, whole
        _log(request, response.status_code, record, start)
    else:  # the route's answer: logged once its last byte is sent, or its client has left
        response.body_iterator = _logged(body, request, response.status_code, record, start)
    return response


async def _logged(
    body: AsyncIterator[bytes], request: Request, status: int, record: AccessRecord, start: float
) -> AsyncIterator[bytes]:
    sent = False
    try:
        async for chunk in body:
            yield chunk
        sent = True
    finally:
        _log(request, record.status or (status if sent else CLIENT_LEFT), record, start)


def _log(request: Request, status: int, record: AccessRecord, start: float) -> None:
    client = f"{request.client.host}:{request.client.port}" if request.client else "-"
    tokens = ""
    if record.prompt_tokens or record.completion_tokens:
        tokens = f", {record.prompt_tokens} prompt + {record.completion_tokens} completion tokens"
    logger.info(
        "%s %s %s -> %d in %.1f ms%s",
        client,
        request.method,
        request.url.path,
        status,
        (time.perf_counter() - start) * 1e3,
        tokens,
    )
