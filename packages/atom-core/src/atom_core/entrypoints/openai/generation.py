"""One generation request, from the engine to its answer: started first (bad input is refused there,
before any byte is sent), then either streamed as server-sent events or collected whole. A collecting
request whose client leaves is aborted rather than left to run for nobody."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

from atom_core.engine.async_engine import AsyncEngine, EngineDead, RequestFailed
from atom_core.engine.llm_engine import Prompt
from atom_core.engine.outputs import RequestOutput
from atom_core.engine.sampling_params import SamplingParams
from atom_core.entrypoints.openai.errors import ApiError, engine_failure
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
) -> dict | StreamingResponse:
    kind = "chatcmpl" if isinstance(body, ChatCompletionRequest) else "cmpl"
    request_id = f"{kind}-{uuid.uuid4().hex}"
    fmt = formatter_for(request_id, int(time.time()))
    try:
        stream = engine.generate(prompt, params, request_id)
        first = await anext(stream)  # bad input raises here, before any byte is sent
    except ValueError as err:
        raise ApiError(400, str(err)) from err
    except (RequestFailed, EngineDead) as err:
        raise engine_failure(err) from err
    if body.stream:
        return event_stream(first, stream, fmt, include_usage=body.include_usage)
    return fmt.full(await _collect_while_connected(request, first, stream))


async def _collect_while_connected(
    request: Request, first: RequestOutput, stream: AsyncIterator[RequestOutput]
) -> RequestOutput:
    """The request's final output; 499 if the client leaves first."""
    collect = asyncio.ensure_future(_last(first, stream))
    gone = asyncio.ensure_future(_client_gone(request))
    await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not collect.done():  # the client left: stop the work (the stream's close aborts the request)
        collect.cancel()
        await asyncio.gather(collect, return_exceptions=True)
        raise ApiError(499, "the client closed the connection")
    gone.cancel()
    try:
        return collect.result()
    except (RequestFailed, EngineDead) as err:
        raise engine_failure(err) from err


async def _last(first: RequestOutput, stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = first
    async for out in stream:
        final = out
    return final


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body was read already, so receive() waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
