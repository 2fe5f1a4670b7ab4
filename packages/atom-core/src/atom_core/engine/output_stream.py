"""One request's outputs on their way from the engine's thread to its reader on the event loop.

The engine thread never waits for a reader: it hands each output to the loop, where OutputStream keeps at
most one undelivered output per request. Outputs that arrive before the reader takes the last are merged
into it (deltas concatenated; a cumulative or final output replaces what it supersedes), so a reader that
falls behind costs what it has not read, never a queue of copies. A reader that stops reading altogether
(a streaming client that keeps its socket open but reads nothing) would still let that grow with the
request's text: past `max_buffered_tokens` unread tokens the stream fails with ReaderTooSlow and the
engine is told to drop the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from atom_core.engine.outputs import CompletionOutput, OutputKind, RequestOutput


class ReaderTooSlow(RuntimeError):
    """The request's reader left more than the stream's bound unread; the request was dropped."""


class OutputStream:
    """Lives on one event loop: put() from that loop (the engine thread uses call_soon_threadsafe)."""

    def __init__(self, kind: OutputKind, max_buffered_tokens: int, on_overflow: Callable[[], None]):
        self.kind = kind
        self.max_buffered_tokens = max_buffered_tokens
        self._on_overflow = on_overflow
        self._pending: RequestOutput | None = None
        self._buffered = 0  # tokens in _pending (deltas only: a cumulative output is one copy anyway)
        self._failure: BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, out: RequestOutput) -> None:
        if self._failure is not None:
            return
        if self._pending is None or self.kind is not OutputKind.DELTA or out.error is not None:
            self._pending = out
        else:
            _merge(self._pending, out)
        if self.kind is OutputKind.DELTA:
            self._buffered = sum(len(c.token_ids) for c in self._pending.outputs)
            if self._buffered > self.max_buffered_tokens and not self._pending.finished:
                self.fail(ReaderTooSlow(f"more than {self.max_buffered_tokens} tokens were left unread"))
                self._on_overflow()
                return
        self._ready.set()

    def fail(self, err: BaseException) -> None:
        """The next get() raises err (what was pending is dropped), unless the request's final output is
        already here: a request that finished is answered, whatever ended the others."""
        if self._pending is not None and self._pending.finished and self._pending.error is None:
            return
        self._failure, self._pending = err, None
        self._ready.set()

    async def get(self) -> RequestOutput:
        """The next output: everything that arrived since the last get(), merged."""
        await self._ready.wait()
        if self._failure is not None:
            raise self._failure
        out, self._pending, self._buffered = self._pending, None, 0
        self._ready.clear()
        return out


def _merge(into: RequestOutput, new: RequestOutput) -> None:
    """into, then new (both deltas of one request), as one delta."""
    by_index: dict[int, CompletionOutput] = {c.index: c for c in into.outputs}
    for c in new.outputs:
        old = by_index.get(c.index)
        if old is None:
            into.outputs.append(c)
            continue
        old.text += c.text
        old.token_ids += c.token_ids
        if old.logprobs is not None and c.logprobs is not None:
            old.logprobs += c.logprobs
        old.finish_reason = c.finish_reason
        old.num_draft_tokens, old.num_accepted_tokens = c.num_draft_tokens, c.num_accepted_tokens
    into.finished = new.finished
