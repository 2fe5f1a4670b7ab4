"""The routes: /health, /metrics, /v1/models, /v1/completions and /v1/chat/completions.

Each handler reads what it serves from the app (state.py), checks the request (validation.py) and hands
it to generation.py; a refusal is raised as an ApiError (errors.py). response_model=None: bodies are
returned as built, never re-validated against the return annotation.
"""

from __future__ import annotations

import asyncio
import json
from functools import partial
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from atom_core.engine.async_engine import AsyncEngine
from atom_core.engine.sampling_params import SamplingParams
from atom_core.entrypoints.openai.errors import ApiError, engine_dead
from atom_core.entrypoints.openai.generation import FormatterFor, generate
from atom_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from atom_core.entrypoints.openai.reasoning import opened_in_prompt
from atom_core.entrypoints.openai.responses import Formatter
from atom_core.entrypoints.openai.state import ServerState, server_state
from atom_core.entrypoints.openai.tool_calls import ToolPlan, tool_plan
from atom_core.entrypoints.openai.validation import chat_prompt, check_model, completion_params

router = APIRouter()


@router.get("/health", response_model=None)
async def health(request: Request) -> dict:
    engine = server_state(request).engine
    if engine.dead is not None:
        raise engine_dead(engine.dead)
    return {"status": "ok", "requests": len(engine.engine.requests)}  # requests in the engine now


@router.get("/metrics", response_model=None)
async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    body = server_state(request).metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_model=None)
async def models(request: Request) -> dict:
    state = server_state(request)
    max_len = state.engine.engine.max_model_len
    cards = [{"id": n, "object": "model", "owned_by": "atom", "max_model_len": max_len} for n in state.names]
    return {"object": "list", "data": cards}


Body = TypeVar("Body", bound=BaseModel)
# bodies larger than this are parsed and validated on a worker thread: the event loop keeps serving
LARGE_BODY_BYTES = 64 * 1024


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The request's JSON body as `model` (as FastAPI would parse it, errors included), large ones off
    the event loop."""
    raw = await request.body()
    if len(raw) > LARGE_BODY_BYTES:
        return await asyncio.to_thread(_validate, raw, model)
    return _validate(raw, model)


def _validate(raw: bytes, model: type[Body]) -> Body:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": ""}]) from None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RequestValidationError(err.errors(include_url=False)) from None


@router.post("/v1/completions", response_model=None)
async def completions(request: Request) -> Response | StreamingResponse:
    body = await parse_body(request, CompletionRequest)
    state = server_state(request)
    check_model(body.model, state.names)
    params = completion_params(body, state.engine.engine.generation_defaults)
    prompts = body.prompts()
    first = prompts[0] if isinstance(prompts[0], str) else prompts[0]["prompt_token_ids"]
    echo = await _as_text(state.engine, first) if body.echo else ""  # (one prompt: checked_params)
    formatter_for = _formatter_for(state, params, chat=False, echo=echo)
    return await generate(state.engine, request, body, prompts, params, formatter_for)


@router.post("/v1/chat/completions", response_model=None)
async def chat(request: Request) -> Response | StreamingResponse:
    body = await parse_body(request, ChatCompletionRequest)
    state = server_state(request)
    check_model(body.model, state.names)
    ids, params = await chat_prompt(state.engine, body, harmony=state.harmony is not None)
    try:
        tools = tool_plan(body.tools, body.tool_choice, state.tool_parser)
    except ValueError as err:
        raise ApiError(400, str(err), code="tool_choice_unsupported") from err
    reasoning = None
    if state.harmony is not None:  # the answer's messages are read from its tokens (harmony.py)
        reasoning = None if state.reasoning_parser is None else ("harmony", False)
    elif state.reasoning_parser is not None:  # does the prompt leave a think block open? (its tail tells)
        tail = await state.engine.run_tokenizer(state.engine.engine.tokenizer.decode, ids[-16:])
        reasoning = (state.reasoning_parser, opened_in_prompt(tail, state.reasoning_parser))
    formatter_for = _formatter_for(state, params, chat=True, reasoning=reasoning, tools=tools)
    return await generate(state.engine, request, body, [{"prompt_token_ids": ids}], params, formatter_for)


def _formatter_for(
    state: ServerState,
    params: SamplingParams,
    *,
    chat: bool,
    echo: str = "",
    reasoning: tuple[str, bool] | None = None,
    tools: ToolPlan | None = None,
) -> FormatterFor:
    """The request's Formatter, once generate() has given it an id and a creation time."""
    top_logprobs = params.logprobs or 0
    return partial(
        Formatter,
        state.engine.engine.tokenizer,
        state.model_name,
        chat=chat,
        echo=echo,
        top_logprobs=top_logprobs,
        echo_scores=params.prompt_logprobs is not None,
        reasoning=reasoning,
        tools=tools,
        harmony=state.harmony if chat else None,
    )


async def _as_text(engine: AsyncEngine, prompt: str | list[int]) -> str:
    """The prompt as echo prefixes it: text as given, token ids decoded (to nothing without a tokenizer)."""
    if isinstance(prompt, str):
        return prompt
    tokenizer = engine.engine.tokenizer
    if tokenizer is None:
        return ""
    return await engine.run_tokenizer(lambda: tokenizer.decode(prompt, skip_special_tokens=True))
