"""The engine for a server: one background thread steps the engine; each request awaits its own queue.

A failure inside a step fails the requests it touched (their streams raise RequestFailed with the
reason) and the engine goes on with the others. When steps keep failing, the engine cannot run any more:
it is marked dead (`dead` says why), every waiting request fails, and `on_dead` tells the server, which
then reports unhealthy and exits rather than hang. Tokenization runs on its own thread, outside the
engine lock, so a long prompt delays neither the event loop nor the engine's steps; the event loop never
waits for the engine lock either (admission runs on a worker thread, aborts go through an inbox that
the engine thread drains between steps).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from atom_core.engine.llm_engine import LLMEngine, Prompt
from atom_core.engine.outputs import RequestOutput
from atom_core.engine.sampling_params import SamplingParams

logger = logging.getLogger("atom.engine")


class RequestFailed(RuntimeError):
    """The engine failed this request (the others go on); the message says why."""


class EngineDead(RuntimeError):
    """The engine can no longer run; the message says why."""


class AsyncEngine:
    MAX_FAILED_STEPS = 3  # steps failing in a row before the engine is declared dead

    def __init__(self, engine: LLMEngine, on_dead: Callable[[str], None] | None = None):
        self.engine = engine
        self.on_dead = on_dead
        self.dead: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._failed_steps = 0  # steps that raised outside the forward (the engine counts forward failures)
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()  # requests whose clients left
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
            if self._failed_steps + self.engine.consecutive_failures >= self.MAX_FAILED_STEPS:
                self._die("the engine failed on every recent step; see the server log")

    def _step(self) -> list[RequestOutput] | None:
        try:
            with self._lock:
                while not self._aborts.empty():
                    self.engine.abort(self._aborts.get())
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
            if (target := self._queues.get(out.request_id)) is not None:
                loop, queue = target
                loop.call_soon_threadsafe(queue.put_nowait, out)

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

    async def generate(
        self, prompt: Prompt, params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Streams this request's outputs until it finishes. Raises ValueError before any output for bad
        input, RequestFailed if the engine failed it, EngineDead if the engine cannot run."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        text, ids = await self.run_tokenizer(self.engine.tokenize, prompt)
        outputs: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), outputs)
        try:
            await asyncio.to_thread(
                self._admit, {"prompt": text, "prompt_token_ids": ids}, params, request_id
            )
        except BaseException:
            self._queues.pop(request_id, None)
            raise
        self._wake.set()
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                if out.error is not None:
                    raise RequestFailed(out.error)
                finished = out.finished
                yield out
        finally:
            self._queues.pop(request_id, None)
            if not finished:  # the client went away (or the request failed): the engine frees it
                self._aborts.put(request_id)
                self._wake.set()

    def _admit(self, prompt: Prompt, params: SamplingParams, request_id: str) -> None:
        with self._lock:
            self.engine.add_request(prompt, params, request_id)

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
        self._tokenizer_thread.shutdown(wait=False, cancel_futures=True)
