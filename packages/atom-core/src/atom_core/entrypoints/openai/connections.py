"""The HTTP server process: connections bounded, shutdown graceful.

GuardedH11Protocol (uvicorn's h11 protocol) closes a connection that has not sent a complete request head
within request_timeout (just opened, or idle after a response), and closes new connections beyond
max_connections at once: each holds a file descriptor, and a flood of them must not starve real clients.
Server is uvicorn's, except that SIGTERM/SIGINT end `run()` normally once in-flight requests finished (or
shutdown_timeout passed): uvicorn re-raises the signal instead, which would skip the engine's shutdown.
"""

from __future__ import annotations

import contextlib
import signal
import threading

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from atom_core.entrypoints.openai.limits import ServerLimits


class GuardedH11Protocol(H11Protocol):
    limits = ServerLimits()  # set per server by guarded_protocol()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = None
        if len(self.connections) > self.limits.max_connections:
            self.logger.warning("over %d connections: a new one is closed", self.limits.max_connections)
            transport.close()
            return
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:  # a request head arrived
            self._disarm_head_timer()
        elif self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm_head_timer()  # the next request's head has begun after a response

    def connection_lost(self, exc) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.request_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is None or self.cycle.response_complete:  # no request is being served on it
            self.transport.close()


def guarded_protocol(limits: ServerLimits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds connections with, carrying these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


def make_server(app, host: str, port: int, limits: ServerLimits) -> Server:
    return Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            http=guarded_protocol(limits),
            timeout_keep_alive=limits.keep_alive_timeout,
            timeout_graceful_shutdown=limits.shutdown_timeout,
        )
    )
