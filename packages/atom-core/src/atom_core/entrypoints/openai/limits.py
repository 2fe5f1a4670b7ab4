"""What the server bounds, so that no client can hold it: request bodies, slow or idle connections,
their number (connections.py), and shutdown.

BodyLimit (ASGI middleware) reads a request's whole body before the app sees it, within request_timeout
(else 408). A body over max_body_bytes gets 413 once the client has sent it, up to max_discard_bytes
read and dropped: a close with the client's bytes unread resets the connection, and clients that send the
whole body before reading meet that reset, not the 413 (urllib; httpx, and so the openai client, read the
answer after a failed write, unless the reset discarded it). Answered at once: a body declared beyond that
bound, and one whose client waits for `100 Continue` before sending it. After the body, the app's
receive() reaches the connection again (so a handler can tell when its client has gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_body_bytes: int = 8 * 1024 * 1024
    max_discard_bytes: int = 64 * 1024 * 1024  # of a body over max_body_bytes, read before its 413
    # seconds to send a request's head once begun, and then its body; and to read some of the response
    # once the buffers towards the client are full
    request_timeout: float = 30.0
    keep_alive_timeout: float = 5.0  # a connection with no request under way (new, or kept alive) closes
    max_connections: int = 512  # open connections (keep it under the process's file limit)
    # SIGTERM: new requests get 503; in-flight ones get this long, then end with an error (a stream's
    # error event, a 503); a second SIGTERM ends them at once
    shutdown_timeout: float = 10.0
    max_stream_buffer_tokens: int = 65536  # a stream's unread tokens before its request is dropped

    def __post_init__(self):
        for name in (
            "max_body_bytes",
            "max_discard_bytes",
            "request_timeout",
            "keep_alive_timeout",
            "max_connections",
            "shutdown_timeout",
            "max_stream_buffer_tokens",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")


class _ClientLeft(Exception):
    pass


class _Body:
    """One request's body as it arrives: its pieces (while kept), its size, whether it has ended."""

    def __init__(self, receive):
        self.receive, self.chunks, self.size, self.ended = receive, [], 0, False

    async def read(self, up_to: int, keep: bool) -> None:
        """Receive until the body ends or is over `up_to` bytes; raises _ClientLeft."""
        while not self.ended and self.size <= up_to:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise _ClientLeft
            data = message.get("body", b"")
            self.size += len(data)
            self.ended = not message.get("more_body", False)
            if keep:
                self.chunks.append(data)


class BodyLimit:
    def __init__(self, app, limits: ServerLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self._too_large_to_read(dict(scope["headers"])):
            return await self._too_large(send)
        body = _Body(receive)
        deadline = asyncio.get_running_loop().time() + self.limits.request_timeout
        try:
            async with asyncio.timeout_at(deadline):
                await body.read(up_to=self.limits.max_body_bytes, keep=True)
        except TimeoutError:
            return await _reply(
                send, 408, f"the request body did not arrive within {self.limits.request_timeout} s"
            )
        except _ClientLeft:
            return None
        if body.size > self.limits.max_body_bytes:
            await self._discard(body, deadline)
            return await self._too_large(send)
        whole = b"".join(body.chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    def _too_large_to_read(self, headers: dict) -> bool:
        """A declared body over the limit that is not worth reading: its client waits for a 100 Continue
        (so it reads this answer, and sends nothing), or it is beyond what is read to be dropped."""
        declared = headers.get(b"content-length")
        if declared is None or not declared.isdigit() or int(declared) <= self.limits.max_body_bytes:
            return False
        waiting = headers.get(b"expect", b"").lower() == b"100-continue"
        return waiting or int(declared) > self.limits.max_discard_bytes

    async def _discard(self, body: _Body, deadline: float) -> None:
        """Read the rest of a body over the limit and drop it, within max_discard_bytes and the deadline:
        the 413 then reaches a client still sending, which a close with its bytes unread would reset.
        A client that leaves, or one that is too slow, just gets the 413 now."""
        body.chunks.clear()
        with contextlib.suppress(TimeoutError, _ClientLeft):
            async with asyncio.timeout_at(deadline):
                await body.read(up_to=self.limits.max_discard_bytes, keep=False)

    async def _too_large(self, send) -> None:
        await _reply(send, 413, f"the request body is larger than {self.limits.max_body_bytes} bytes")


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
