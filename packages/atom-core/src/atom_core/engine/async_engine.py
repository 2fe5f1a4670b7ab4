"""The engine for a server: one background thread steps the engine; each request awaits its own queue.

A failure inside a step fails the requests it touched (their streams raise RequestFailed with the
reason) and the engine goes on with the others. When steps keep failing, the engine cannot run any more:
it is marked dead (`dead` says why), every waiting request fails, and `on_dead` tells the server, which
then reports unhealthy and exits rather than hang. Tokenization runs on its own thread, outside the
engine lock, so a long prompt delays neither the event loop nor the engine's steps; the event loop never
waits for the engine lock either (admission runs on a worker thread, aborts go through an inbox that
the engine thread drains between steps).

Each request's outputs reach its reader through an OutputStream (output_stream.py): merged while the
reader is behind, bounded when it stops reading. On shutdown, `fail_all` ends every request with a reason
its reader can report (a stream's error event, a 503 otherwise).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from atom_core.engine.llm_engine import LLMEngine, Prompt
from atom_core.engine.output_stream import OutputStream, ReaderTooSlow
from atom_core.engine.outputs import RequestOutput
from atom_core.engine.sampling_params import SamplingParams

logger = logging.getLogger("atom.engine")


class RequestFailed(RuntimeError):
    """The engine failed this request (the others go on); the message says why."""


class EngineDead(RuntimeError):
    """The engine can no longer run; the message says why."""


class ShuttingDown(RuntimeError):
    """The server is shutting down: this request was ended before it finished."""


__all__ = ["AsyncEngine", "EngineDead", "ReaderTooSlow", "RequestFailed", "ShuttingDown"]


class AsyncEngine:
    MAX_FAILED_STEPS = 3  # steps failing in a row before the engine is declared dead

    def __init__(
        self,
        engine: LLMEngine,
        on_dead: Callable[[str], None] | None = None,
        *,
        max_buffered_tokens: int = 65536,
    ):
        """max_buffered_tokens: unread tokens a request's stream may hold before the request is dropped
        (its reader stopped reading)."""
        self.engine = engine
        self.max_buffered_tokens = max_buffered_tokens
        self.on_dead = on_dead
        self.dead: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, OutputStream]] = {}
        self._failed_steps = 0  # steps that raised outside the forward (the engine counts forward failures)
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()  # requests whose clients left
        self._ending: str | None = None  # fail_all's reason, until the engine thread has applied it
        self.closed: str | None = None  # fail_all's reason: no request is admitted any more
        self._tokenizer_thread = ThreadPoolExecutor(
            1, thread_name_prefix="atom-tokenize"
        )  # one: not reentrant
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="atom-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop and self.dead is None:
            outputs = self._step()
            if outputs is None:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            self._deliver(outputs)
            if self._failed_steps + self.engine.stats.consecutive_failures >= self.MAX_FAILED_STEPS:
                self._die("the engine failed on every recent step; see the server log")

    def _step(self) -> list[RequestOutput] | None:
        try:
            with self._lock:
                while not self._aborts.empty():
                    self.engine.abort(self._aborts.get())
                if self._ending is not None:
                    self._end_all(self._ending)
                if not self.engine.has_unfinished_requests():
                    return None
                outputs = self.engine.step()
            self._failed_steps = 0
            return outputs
        except Exception as err:  # the engine's own state may be off: fail what it holds, then go on
            logger.exception("an engine step failed")
            self._failed_steps += 1
            with self._lock:
                reason = f"the engine failed ({type(err).__name__}; the server log has the details)"
                return self.engine.fail(dict.fromkeys(self.engine.requests, reason))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            if (target := self._streams.get(out.request_id)) is not None:
                loop, stream = target
                loop.call_soon_threadsafe(stream.put, out)

    def fail_all(self, reason: str) -> None:
        """End every request now (the server is shutting down): each reader gets ShuttingDown(reason), and
        so does every request added from now on."""
        self.closed = self._ending = reason
        self._wake.set()
        if not self._thread.is_alive():  # no engine thread to apply it: fail the readers directly
            self._end_all(reason)

    def _end_all(self, reason: str) -> None:
        self._ending = None
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
        for loop, stream in list(self._streams.values()):
            loop.call_soon_threadsafe(stream.fail, ShuttingDown(reason))

    def _die(self, reason: str) -> None:
        self.dead = reason
        logger.error("engine dead: %s", reason)
        with self._lock:
            self._deliver(
                self.engine.fail(dict.fromkeys(self.engine.requests, f"the engine is dead: {reason}"))
            )
        if self.on_dead is not None:
            self.on_dead(reason)

    async def run_tokenizer(self, fn: Callable, *args):
        """fn(*args) on the tokenizer thread (tokenizers are not safe to call from several threads)."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, fn, *args)

    async def add(self, prompt: Prompt, params: SamplingParams, request_id: str) -> OutputStream:
        """Admit a request (ValueError for bad input: nothing is left behind; EngineDead, ShuttingDown);
        its outputs arrive on the returned stream. Read them with outputs(); a caller that stops early must call abort()."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        text, ids = await self.run_tokenizer(_prepare, self.engine, prompt, params)
        if self.closed is not None:
            raise ShuttingDown(self.closed)
        stream = OutputStream(
            params.output_kind, self.max_buffered_tokens, on_overflow=lambda: self._overflowed(request_id)
        )
        self._streams[request_id] = (asyncio.get_running_loop(), stream)
        prompt = {"prompt": text, "prompt_token_ids": ids}
        admission = asyncio.ensure_future(asyncio.to_thread(self._admit, prompt, params, request_id))
        try:
            await asyncio.shield(admission)  # a caller cancelled meanwhile cannot stop the thread
        except BaseException:
            self._streams.pop(request_id, None)
            # admitted all the same (the caller was cancelled): nobody will read it, so it is dropped
            admission.add_done_callback(lambda done: self._drop_if_admitted(done, request_id))
            raise
        self._wake.set()
        return stream

    async def outputs(self, stream: OutputStream, request_id: str) -> AsyncIterator[RequestOutput]:
        """The request's outputs until it finishes; RequestFailed if the engine failed it, ReaderTooSlow or
        ShuttingDown if it was dropped. Leaving early (or failing) aborts the request."""
        finished = False
        try:
            while not finished:
                out = await stream.get()
                if out.error is not None:
                    raise RequestFailed(out.error)
                finished = out.finished
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the client went away (or the request failed): the engine frees it
                self.abort(request_id)

    async def generate(
        self, prompt: Prompt, params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Streams this request's outputs until it finishes. Raises ValueError before any output for bad
        input, RequestFailed if the engine failed it, EngineDead if the engine cannot run."""
        stream = await self.add(prompt, params, request_id)
        async for out in self.outputs(stream, request_id):
            yield out

    def _overflowed(self, request_id: str) -> None:
        logger.warning(
            "request %s dropped: its client stopped reading (over %d tokens unread)",
            request_id,
            self.max_buffered_tokens,
        )
        self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Drop a request (from any thread): the engine thread frees it before its next step."""
        self._aborts.put(request_id)
        self._wake.set()

    def _drop_if_admitted(self, admission: asyncio.Future, request_id: str) -> None:
        if not admission.cancelled() and admission.exception() is None:
            self.abort(request_id)

    def _admit(self, prompt: Prompt, params: SamplingParams, request_id: str) -> None:
        with self._lock:  # (the engine may have died, or been closed, while this waited for the lock)
            if self.dead is not None:
                raise EngineDead(self.dead)
            if self.closed is not None:
                raise ShuttingDown(self.closed)
            self.engine.add_request(prompt, params, request_id)

    def shutdown(self) -> None:
        """Stop the engine thread (requests still held are not answered: fail_all first to answer them)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
        if self._ending is not None and not self._thread.is_alive():  # fail_all came after its last step
            self._end_all(self._ending)
        self._tokenizer_thread.shutdown(wait=False, cancel_futures=True)


def _prepare(engine: LLMEngine, prompt: Prompt, params: SamplingParams) -> tuple[str | None, list[int]]:
    """On the tokenizer thread: the prompt's tokens, the stop strings' automaton and the structured output's
    grammar built (not on the engine thread, where every running request would wait for them)."""
    params.stop_strings()
    if params.structured_outputs is not None:
        engine.compile_grammar(params)
    return engine.tokenize(prompt)
