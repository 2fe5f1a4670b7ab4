"""A completion request with a list of prompts (OpenAI allows strings or token lists): one engine request
a prompt, their outputs merged into one answer whose choice i * n + j is prompt i's sample j, as OpenAI
and vLLM number them. Usage counts every prompt's tokens."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from atom_core.engine.outputs import RequestOutput


async def merged_outputs(streams: list[AsyncIterator[RequestOutput]], n: int) -> AsyncIterator[RequestOutput]:
    """The prompts' outputs as they come, each as one RequestOutput of that prompt's choices renumbered;
    `finished` once every prompt has finished, and prompt_token_ids every prompt's seen so far, in
    order (what usage counts). An error in any stream ends the merge with it; leaving it (or an error)
    closes every stream, which aborts their requests."""
    prompt_ids: list[list[int]] = [[] for _ in streams]
    pending = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
    left = len(streams)
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=pending.get):  # (prompt order among those ready together)
                i = pending.pop(future)
                try:
                    out = future.result()
                except StopAsyncIteration:
                    continue
                prompt_ids[i] = out.prompt_token_ids
                left -= out.finished
                if not out.finished:
                    pending[asyncio.ensure_future(anext(streams[i]))] = i
                outputs = [dataclasses.replace(c, index=i * n + c.index) for c in out.outputs]
                ids = [t for p in prompt_ids for t in p]
                yield RequestOutput(out.request_id, None, ids, outputs, finished=left == 0)
    finally:
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def merged_final(finals: list[RequestOutput], n: int) -> RequestOutput:
    """One answer of the prompts' final outputs (FINAL_ONLY: one each)."""
    outputs = [
        dataclasses.replace(c, index=i * n + c.index) for i, out in enumerate(finals) for c in out.outputs
    ]
    ids = [t for out in finals for t in out.prompt_token_ids]
    return RequestOutput(finals[0].request_id, None, ids, outputs, finished=True)
