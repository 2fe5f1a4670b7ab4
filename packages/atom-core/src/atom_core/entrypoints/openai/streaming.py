"""Server-sent events for a streaming request: each choice's new text (and its new tokens' logprobs) as it
comes, one finishing chunk per choice, optionally a usage chunk, then [DONE]. The engine holds back text
that may still become a stop string, so the streamed text always equals the non-streamed text. A request
the engine fails mid-stream ends with an error event."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from atom_core.engine.async_engine import EngineDead, RequestFailed
from atom_core.engine.outputs import RequestOutput
from atom_core.entrypoints.openai.responses import Formatter, error_body, usage


def event_stream(
    first: RequestOutput, stream: AsyncIterator[RequestOutput], fmt: Formatter, *, include_usage: bool
) -> StreamingResponse:
    """The streaming answer to a request whose first output is `first` and the rest still to come."""
    return StreamingResponse(
        stream_events(first, stream, fmt, include_usage=include_usage), media_type="text/event-stream"
    )


async def stream_events(
    first: RequestOutput, stream: AsyncIterator[RequestOutput], fmt: Formatter, *, include_usage: bool
) -> AsyncIterator[str]:
    sent_text: dict[int, int] = {}  # choice -> characters sent
    sent_tokens: dict[int, int] = {}  # choice -> tokens whose logprobs were sent
    done: set[int] = set()
    out = first
    try:
        while True:
            choices = []
            for c in out.outputs:
                if c.index in done:
                    continue
                text = c.text[sent_text.get(c.index, 0) :]
                start = sent_tokens.get(c.index, 0)
                if not text and c.finish_reason is None and len(c.token_ids) == start:
                    continue
                logprobs = fmt.logprobs(c, start, text_offset=sent_text.get(c.index, 0))
                choices.append(fmt.delta(c, text, first=c.index not in sent_text, logprobs=logprobs))
                sent_text[c.index], sent_tokens[c.index] = len(c.text), len(c.token_ids)
                if c.finish_reason is not None:
                    done.add(c.index)
            if choices:
                yield fmt.chunk(choices)
            if out.finished:
                break
            out = await anext(stream, None)
            if out is None:
                break
    except (RequestFailed, EngineDead) as err:
        kind = "service_unavailable" if isinstance(err, EngineDead) else "internal_error"
        yield f"data: {json.dumps(error_body(500, f'the engine failed this request: {err}', kind))}\n\n"
        return
    if include_usage:
        yield fmt.chunk([], usage(out))
    yield "data: [DONE]\n\n"
