"""What the server bounds, so that no client can hold it: request bodies, slow or idle connections,
their number (connections.py), and shutdown.

BodyLimit (ASGI middleware) reads a request's whole body before the app sees it: over max_body_bytes it
answers 413 at once, slower than request_timeout it answers 408. After the body, the app's receive()
reaches the connection again (so a handler can tell when its client has gone).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_body_bytes: int = 8 * 1024 * 1024
    request_timeout: float = 30.0  # seconds to send a request's head, and then its body
    keep_alive_timeout: float = 5.0  # an idle keep-alive connection is closed after this
    max_connections: int = 512  # open connections (keep it under the process's file limit)
    shutdown_timeout: float = 10.0  # SIGTERM: in-flight requests get this long, then are cancelled

    def __post_init__(self):
        for name in (
            "max_body_bytes",
            "request_timeout",
            "keep_alive_timeout",
            "max_connections",
            "shutdown_timeout",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")


class BodyLimit:
    def __init__(self, app, limits: ServerLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            return await _reply(
                send, 413, f"the request body is larger than {self.limits.max_body_bytes} bytes"
            )
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.limits.request_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    if size > self.limits.max_body_bytes:
                        return await _reply(
                            send, 413, f"the request body is larger than {self.limits.max_body_bytes} bytes"
                        )
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return await _reply(
                send, 408, f"the request body did not arrive within {self.limits.request_timeout} s"
            )
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _reply(send, status: int, message: str) -> None:
    from atom_core.entrypoints.openai.responses import error_body  # here: the CLI imports this module cheaply

    payload = json.dumps(error_body(status, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": payload})
