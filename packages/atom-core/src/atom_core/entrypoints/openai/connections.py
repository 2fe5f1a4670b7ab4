"""The HTTP server process: connections bounded, shutdown graceful.

GuardedH11Protocol (uvicorn's h11 protocol) bounds how long a connection may hold a file descriptor
without being served: one with no request under way and no byte of the next (just opened, or kept alive
after a response) is idle, and is closed after keep_alive_timeout (uvicorn's keep-alive timer, armed from
the start too); once a request head has begun arriving, request_timeout bounds the time to complete it.
At max_connections, a new connection closes the connection idle the longest to get in, and is refused
only when none is idle: silent sockets held at the cap would otherwise lock every real client out. A
client that reads nothing of its response while the buffers are full loses its connection after
request_timeout (a stream it stopped reading would otherwise hold its slot forever).
Server is uvicorn's, except for shutdown: SIGTERM/SIGINT refuse new requests (503), let in-flight ones run
for shutdown_timeout and then end them with an error their clients read (an error event then [DONE], or
a 503), so no task is cancelled mid-answer; a second signal ends them at once; `run()` then returns
normally (uvicorn re-raises the signal instead, which would skip the engine's shutdown).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import signal
import termios
import threading
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from atom_core.entrypoints.openai.limits import ServerLimits

LOG_EVERY = 10.0  # seconds: a flood at the cap is logged as counts, not a line a connection


class ConnectionBook:
    """One server's idle connections, longest idle first, and what the cap did since it was last logged."""

    def __init__(self):
        self.idle: dict[GuardedH11Protocol, None] = {}  # insertion-ordered: the first one is idle longest
        self.closed_idle = self.refused = 0
        self.next_log = 0.0


class GuardedH11Protocol(H11Protocol):
    limits = ServerLimits()  # set per server by guarded_protocol()
    book = ConnectionBook()  # set per server by guarded_protocol()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = self._write_timer = None
        if len(self.connections) > self.limits.max_connections and not self._close_longest_idle():
            self.book.refused += 1
            self._log_the_cap()
            self._drop()
            return
        self._become_idle()

    def data_received(self, data: bytes) -> None:
        self.book.idle.pop(self, None)  # uvicorn's data_received stops the keep-alive timer
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:  # a request head arrived
            self._disarm_head_timer()
        elif self._head_timer is None and self._between_requests():
            self._arm_head_timer()  # the next request's head has begun

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer; starts a pipelined request
        if self.transport.is_closing() or not self._between_requests():
            return
        if self.conn.trailing_data[0]:  # part of the next head came with the last request: not idle
            self._unset_keepalive_if_required()
            self._arm_head_timer()
        else:
            self._become_idle()

    def connection_lost(self, exc) -> None:
        self.book.idle.pop(self, None)
        self._disarm_head_timer()
        self._disarm_write_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The transport's buffer is full: the client reads nothing of what it is sent. One that reads
        nothing for request_timeout loses the connection (its response task would wait forever, holding
        a slot of max_connections that is never idle)."""
        super().pause_writing()
        if getattr(self, "_write_timer", None) is None:
            self._write_timer = self.loop.call_later(self.limits.request_timeout, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write_timer()

    def _disarm_write_timer(self) -> None:
        if getattr(self, "_write_timer", None) is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_stalled(self) -> None:
        self._write_timer = None
        self.logger.warning(
            "a client read nothing of its response for %s s: its connection is closed",
            self.limits.request_timeout,
        )
        self.transport.abort()  # close() would wait to send what it has buffered

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _become_idle(self) -> None:
        self.book.idle.pop(self, None)
        self.book.idle[self] = None
        if self.timeout_keep_alive_task is None:  # a fresh connection: uvicorn arms it after responses only
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _close_longest_idle(self) -> bool:
        victim = next((c for c in self.book.idle if not c._bytes_waiting()), None)
        if victim is None:
            return False
        self.book.closed_idle += 1
        self._log_the_cap()
        victim._drop()
        return True

    def _bytes_waiting(self) -> bool:
        """Whether the client's bytes wait unread in the kernel: a new connection is read only a loop turn
        or two after it is made, and a burst of new ones (a flood's) would close it as idle before that."""
        sock = self.transport.get_extra_info("socket")
        waiting = array.array("i", [0])
        try:
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, waiting)
        except (AttributeError, OSError):  # no socket (or not one the kernel can say this of): idle
            return False
        return waiting[0] > 0

    def _drop(self) -> None:
        """Close now, and stop counting it at once: uvicorn counts a connection until connection_lost, a loop
        turn later, so a burst of new ones would count those being closed against the cap."""
        self.book.idle.pop(self, None)
        self.connections.discard(self)
        self._unset_keepalive_if_required()
        self.transport.close()

    def _log_the_cap(self) -> None:
        book, now = self.book, self.loop.time()
        if now < book.next_log:
            return
        self.logger.warning(
            "at the cap of %d connections: %d idle ones closed to admit new ones, %d new ones refused "
            "(none was idle) since the last such line",
            self.limits.max_connections,
            book.closed_idle,
            book.refused,
        )
        book.closed_idle = book.refused = 0
        book.next_log = now + LOG_EVERY

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.request_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._between_requests():  # no request is being served on it
            self.transport.close()


def guarded_protocol(limits: ServerLimits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds connections with, carrying these limits and this server's book."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "book": ConnectionBook()})


# uvicorn cancels what still runs this long after shutdown_timeout: only if ending the requests failed
CANCEL_GRACE = 2.0


class Server(uvicorn.Server):
    """uvicorn's server with ATOM's shutdown: on the first SIGTERM/SIGINT `closing()` (new requests get
    503) and, after shutdown_timeout, `end_requests()` (in-flight ones end with an error their clients
    can read); a second signal ends them at once, a third SIGINT stops waiting for them."""

    def __init__(
        self,
        config: uvicorn.Config,
        shutdown_timeout: float,
        closing: Callable[[], None] = lambda: None,
        end_requests: Callable[[], None] = lambda: None,
        on_ready: Callable[[], None] = lambda: None,
    ):
        super().__init__(config)
        self.shutdown_timeout, self.closing, self.end_requests = shutdown_timeout, closing, end_requests
        self.on_ready = on_ready
        self.end_now = False

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:  # listening: requests are accepted from now on
            self.on_ready()

    def handle_exit(self, sig: int, frame) -> None:
        # a signal handler: it only sets flags (ending the requests takes locks the loop may hold)
        if self.should_exit and not self.end_now:
            self.end_now = True  # a second signal: the clients get their errors now
            return
        super().handle_exit(sig, frame)  # the first; a third forces uvicorn's exit (SIGINT)

    async def shutdown(self, sockets=None) -> None:
        self.closing()  # new requests get 503 (also when the engine died: should_exit set without a signal)
        ending = asyncio.ensure_future(self._end_requests_when_due())
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()

    async def _end_requests_when_due(self) -> None:
        """end_requests() once shutdown_timeout has passed, or at once after a second signal."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout
        while loop.time() < deadline and not self.end_now:
            await asyncio.sleep(0.05)
        self.end_requests()

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


def make_server(
    app,
    host: str,
    port: int,
    limits: ServerLimits,
    closing: Callable[[], None] = lambda: None,
    end_requests: Callable[[], None] = lambda: None,
    on_ready: Callable[[], None] = lambda: None,
) -> Server:
    """closing: new requests are refused from now on; end_requests: end every request still running;
    on_ready: the server listens."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=guarded_protocol(limits),
        timeout_keep_alive=limits.keep_alive_timeout,
        timeout_graceful_shutdown=limits.shutdown_timeout + CANCEL_GRACE,
    )
    return Server(config, limits.shutdown_timeout, closing, end_requests, on_ready)
