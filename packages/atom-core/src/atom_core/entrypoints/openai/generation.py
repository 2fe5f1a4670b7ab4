"""One generation request, from the engine to its answer: admitted first (bad input is refused there,
before any byte is sent; a completion's prompts all or none), then either streamed as server-sent
events (the engine sends deltas) or collected whole (the engine sends only the final output). A
collecting request whose client leaves is aborted rather than left to run for nobody. Large answers are
serialised off the event loop."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from atom_core.engine.async_engine import AsyncEngine, EngineDead, ShuttingDown
from atom_core.engine.llm_engine import Prompt
from atom_core.engine.outputs import OutputKind, RequestOutput
from atom_core.engine.sampling_params import SamplingParams
from atom_core.entrypoints.openai.access import access_record
from atom_core.entrypoints.openai.errors import ENDED, ApiError, engine_failure
from atom_core.entrypoints.openai.prompt_batch import merged_final, merged_outputs
from atom_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from atom_core.entrypoints.openai.responses import Formatter
from atom_core.entrypoints.openai.streaming import event_stream

FormatterFor = Callable[[str, int], Formatter]  # (request id, created) -> the request's formatter


async def generate(
    engine: AsyncEngine,
    request: Request,
    body: CompletionRequest | ChatCompletionRequest,
    prompts: list[Prompt],
    params: SamplingParams,
    formatter_for: FormatterFor,
) -> Response | StreamingResponse:
    """One answer for `prompts` (a completion may carry several: prompt_batch.py), each an engine request."""
    kind = "chatcmpl" if isinstance(body, ChatCompletionRequest) else "cmpl"
    request_id = f"{kind}-{uuid.uuid4().hex}"
    fmt = formatter_for(request_id, int(time.time()))
    # a stream sends what is new at each step; a whole answer needs only the final output
    params.output_kind = OutputKind.DELTA if body.stream else OutputKind.FINAL_ONLY
    ids = [request_id] if len(prompts) == 1 else [f"{request_id}-{i}" for i in range(len(prompts))]
    streams = []
    try:
        for prompt, rid in zip(prompts, ids, strict=True):  # bad input raises here, before any byte
            streams.append(await engine.add(prompt, params, rid))
    except BaseException as err:
        for rid in ids[: len(streams)]:  # (the prompts admitted before it)
            engine.abort(rid)
        where = f"prompt {len(streams)}: " if len(prompts) > 1 else ""
        if isinstance(err, ValueError):
            raise ApiError(400, f"{where}{err}") from err
        if isinstance(err, EngineDead | ShuttingDown):
            raise engine_failure(err) from err
        raise
    outputs = [engine.outputs(stream, rid) for stream, rid in zip(streams, ids, strict=True)]
    try:
        if body.stream:
            merged = outputs[0] if len(outputs) == 1 else merged_outputs(outputs, params.n)
            first = await anext(merged)  # a request failing at once gets its status, not an event
            record = access_record(request)
            return event_stream(first, merged, fmt, include_usage=body.include_usage, record=record)
        finals = await _collect_while_connected(request, _finals(outputs))
    except BaseException as err:
        for rid in ids:  # never read (or one prompt failed): nothing else would tell the engine
            engine.abort(rid)
        if isinstance(err, ENDED):
            raise engine_failure(err) from err
        raise
    final = finals[0] if len(finals) == 1 else merged_final(finals, params.n)
    size = sum(len(c.token_ids) for c in final.outputs)
    access_record(request).tokens(len(final.prompt_token_ids), size)
    return await json_response(fmt.full(final), size=size)


async def _collect_while_connected(
    request: Request, finals: Awaitable[list[RequestOutput]]
) -> list[RequestOutput]:
    """The requests' final outputs; 499 if the client leaves first."""
    collect = asyncio.ensure_future(finals)
    gone = asyncio.ensure_future(_client_gone(request))
    await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not collect.done():  # the client left: stop the work (each stream's close aborts its request)
        collect.cancel()
        await asyncio.gather(collect, return_exceptions=True)
        raise ApiError(499, "the client closed the connection")
    gone.cancel()
    return collect.result()


async def _finals(outputs: list[AsyncIterator[RequestOutput]]) -> list[RequestOutput]:
    """Each stream's last output; when one fails (or this is cancelled) the others stop reading at once
    (gather alone would leave them parked on requests the caller then aborts)."""
    readers = [asyncio.ensure_future(_last(o)) for o in outputs]
    try:
        return await asyncio.gather(*readers)
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def _last(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async for out in stream:
        final = out
    return final


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body was read already, so receive() waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# a body with more tokens than this is serialised on a worker thread: the event loop keeps serving
LARGE_RESPONSE_TOKENS = 4096


async def json_response(body: dict, *, size: int) -> Response:
    """body as JSON (never NaN or Infinity: a non-finite number fails this request alone, with a 500)."""
    try:
        if size > LARGE_RESPONSE_TOKENS:
            payload = await asyncio.to_thread(_dumps, body)
        else:
            payload = _dumps(body)
    except ValueError as err:
        raise ApiError(500, "the answer held a non-finite number", "internal_error") from err
    return Response(payload, media_type="application/json")


def _dumps(body: dict) -> bytes:
    return json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()
