"""One generation request, from the engine to its answer: admitted first (bad input is refused there,
before any byte is sent), then either streamed as server-sent events (the engine sends deltas) or
collected whole (the engine sends only the final output). A collecting request whose client leaves is
aborted rather than left to run for nobody. Large answers are serialised off the event loop."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from atom_core.engine.async_engine import AsyncEngine, EngineDead, ShuttingDown
from atom_core.engine.llm_engine import Prompt
from atom_core.engine.outputs import OutputKind, RequestOutput
from atom_core.engine.sampling_params import SamplingParams
from atom_core.entrypoints.openai.errors import ENDED, ApiError, engine_failure
from atom_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from atom_core.entrypoints.openai.responses import Formatter
from atom_core.entrypoints.openai.streaming import event_stream

FormatterFor = Callable[[str, int], Formatter]  # (request id, created) -> the request's formatter


async def generate(
    engine: AsyncEngine,
    request: Request,
    body: CompletionRequest | ChatCompletionRequest,
    prompt: Prompt,
    params: SamplingParams,
    formatter_for: FormatterFor,
) -> Response | StreamingResponse:
    kind = "chatcmpl" if isinstance(body, ChatCompletionRequest) else "cmpl"
    request_id = f"{kind}-{uuid.uuid4().hex}"
    fmt = formatter_for(request_id, int(time.time()))
    # a stream sends what is new at each step; a whole answer needs only the final output
    params.output_kind = OutputKind.DELTA if body.stream else OutputKind.FINAL_ONLY
    try:
        stream = await engine.add(prompt, params, request_id)  # bad input raises here, before any byte
    except ValueError as err:
        raise ApiError(400, str(err)) from err
    except (EngineDead, ShuttingDown) as err:
        raise engine_failure(err) from err
    outputs = engine.outputs(stream, request_id)
    try:
        if body.stream:
            first = await anext(outputs)  # a request failing at once gets its status, not an event
            return event_stream(first, outputs, fmt, include_usage=body.include_usage)
        final = await _collect_while_connected(request, outputs)
    except ENDED as err:
        raise engine_failure(err) from err
    except BaseException:
        engine.abort(request_id)  # never read: nothing else would tell the engine
        raise
    return await json_response(fmt.full(final), size=sum(len(c.token_ids) for c in final.outputs))


async def _collect_while_connected(request: Request, stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    """The request's final output; 499 if the client leaves first."""
    collect = asyncio.ensure_future(_last(stream))
    gone = asyncio.ensure_future(_client_gone(request))
    await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not collect.done():  # the client left: stop the work (the stream's close aborts the request)
        collect.cancel()
        await asyncio.gather(collect, return_exceptions=True)
        raise ApiError(499, "the client closed the connection")
    gone.cancel()
    return collect.result()


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
