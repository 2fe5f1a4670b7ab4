"""The official openai client against an app in this process (ASGI, no socket): one chat request asked
whole and again streamed, and the tool calls a stream's deltas join to."""

from __future__ import annotations

import asyncio

import httpx
import openai


def chat_whole_and_streamed(app, ask: dict, **fields) -> tuple[object, list]:
    """The completion of ask (create()'s fields, updated by fields) asked whole, and the events of the
    same request streamed."""

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/v1") as http:
            client = openai.AsyncOpenAI(base_url="http://t/v1", api_key="none", http_client=http)
            whole = await client.chat.completions.create(**{**ask, **fields})
            stream = await client.chat.completions.create(**{**ask, **fields}, stream=True)
            return whole, [e async for e in stream]

    return asyncio.run(go())


def streamed_calls(events) -> list[dict]:
    """[{name, arguments}] of the tool calls the events' deltas join to, by index."""
    calls = {}
    for e in events:
        for d in (e.choices[0].delta.tool_calls or []) if e.choices else []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
    return [calls[i] for i in sorted(calls)]
