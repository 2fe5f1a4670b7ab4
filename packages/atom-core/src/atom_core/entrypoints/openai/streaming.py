"""Server-sent events for a streaming request: each choice's new text (and its new tokens' logprobs) as it
comes, one finishing chunk per choice, optionally a usage chunk, then [DONE]. The engine sends deltas and
holds back text that may still become a stop string, so the streamed text always equals the non-streamed
text. A request that ends without finishing (the engine failed it, the server is shutting down, the
client stopped reading) ends with an error event, then [DONE]."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from atom_core.engine.outputs import RequestOutput
from atom_core.entrypoints.openai.access import CLIENT_LEFT, AccessRecord
from atom_core.entrypoints.openai.errors import ENDED, engine_failure
from atom_core.entrypoints.openai.responses import Formatter, error_body, usage_counts


def event_stream(
    first: RequestOutput,
    stream: AsyncIterator[RequestOutput],
    fmt: Formatter,
    *,
    include_usage: bool,
    record: AccessRecord,
) -> StreamingResponse:
    """The streaming answer to a request whose first output (a delta) is `first`, the rest still to come;
    record: its access line's tokens and, where it ends in an error event, that error's status."""
    events = stream_events(first, stream, fmt, include_usage=include_usage, record=record)
    return StreamingResponse(events, media_type="text/event-stream")


async def stream_events(
    first: RequestOutput,
    stream: AsyncIterator[RequestOutput],
    fmt: Formatter,
    *,
    include_usage: bool,
    record: AccessRecord | None = None,
) -> AsyncIterator[str]:
    """The events; a stream stopped before its [DONE] (its client left: the server cancels it) records
    499 for the access line, whose response had already said 200."""
    record = record or AccessRecord()
    ended = False
    try:
        async with contextlib.aclosing(_events(first, stream, fmt, include_usage, record)) as events:
            async for event in events:
                yield event
        ended = True
    finally:
        if not ended and record.status is None:
            record.status = CLIENT_LEFT


async def _events(
    first: RequestOutput,
    stream: AsyncIterator[RequestOutput],
    fmt: Formatter,
    include_usage: bool,
    record: AccessRecord,
) -> AsyncIterator[str]:
    sent_chars: dict[int, int] = {}  # choice -> characters sent (completions' logprobs offsets)
    sent_tokens: dict[int, int] = {}  # choice -> tokens sent (usage)
    done: set[int] = set()
    out = scored = first  # scored: the output that carried the prompt's logprobs (echo with logprobs)
    try:
        while True:
            prompt_tokens = len(out.prompt_token_ids)  # (a batch's grows as its prompts report)
            scored = scored if out.prompt_logprobs is None else out
            choices = []
            for c in out.outputs:
                if c.index in done or (not c.text and not c.token_ids and c.finish_reason is None):
                    continue
                first_chunk = c.index not in sent_chars  # (a delta carries its prompt's scores once)
                echoed = scored if fmt.echo_scores and first_chunk else None
                logprobs = fmt.logprobs(c, 0, text_offset=sent_chars.get(c.index, 0), echoed=echoed)
                choices.append(fmt.delta(c, c.text, first=first_chunk, logprobs=logprobs))
                sent_chars[c.index] = sent_chars.get(c.index, 0) + len(c.text)
                sent_tokens[c.index] = sent_tokens.get(c.index, 0) + len(c.token_ids)
                if c.finish_reason is not None:
                    done.add(c.index)
            record.tokens(prompt_tokens, sum(sent_tokens.values()))
            if choices:
                yield fmt.chunk(choices)
            if out.finished:
                break
            out = await anext(stream, None)
            if out is None:
                break
        if include_usage:
            yield fmt.chunk([], usage_counts(prompt_tokens, sum(sent_tokens.values())))
    except ENDED as err:
        api = engine_failure(err)
        record.status = api.status
        yield f"data: {json.dumps(error_body(api.status, api.message, api.kind))}\n\n"
    except ValueError:  # a chunk held a non-finite number: this request fails, in the stream
        message = "the answer held a non-finite number"
        record.status = 500
        yield f"data: {json.dumps(error_body(500, message, 'internal_error'))}\n\n"
    yield "data: [DONE]\n\n"
