"""The engine for a server: one background thread steps the engine; each request awaits its own queue."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from atom_core.engine.llm_engine import LLMEngine, Prompt
from atom_core.engine.outputs import RequestOutput
from atom_core.engine.sampling_params import SamplingParams


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="atom-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                outputs = self.engine.step() if self.engine.has_unfinished_requests() else None
            if outputs is None:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            for out in outputs:
                if (target := self._queues.get(out.request_id)) is not None:
                    loop, queue = target
                    loop.call_soon_threadsafe(queue.put_nowait, out)

    async def generate(
        self, prompt: Prompt, params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Streams this request's outputs until it finishes. Raises ValueError (before any output) for bad input."""
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self.engine.add_request(prompt, params, request_id)
            self._queues[request_id] = (asyncio.get_running_loop(), queue)
        self._wake.set()
        try:
            while True:
                out = await queue.get()
                yield out
                if out.finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            with self._lock:
                if request_id in self.engine.requests:  # the client went away: free its blocks
                    self.engine.abort(request_id)

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
