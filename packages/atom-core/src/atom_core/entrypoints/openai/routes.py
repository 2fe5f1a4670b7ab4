"""The routes: /health, /v1/models, /v1/completions and /v1/chat/completions.

Each handler reads what it serves from the app (state.py), checks the request (validation.py) and hands
it to generation.py; a refusal is raised as an ApiError (errors.py). response_model=None: bodies are
returned as built, never re-validated against the return annotation.
"""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from atom_core.engine.async_engine import AsyncEngine
from atom_core.engine.sampling_params import SamplingParams
from atom_core.entrypoints.openai.errors import engine_dead
from atom_core.entrypoints.openai.generation import FormatterFor, generate
from atom_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from atom_core.entrypoints.openai.responses import Formatter
from atom_core.entrypoints.openai.state import ServerState, server_state
from atom_core.entrypoints.openai.validation import chat_prompt, check_model, completion_params

router = APIRouter()


@router.get("/health", response_model=None)
async def health(request: Request) -> dict:
    engine = server_state(request).engine
    if engine.dead is not None:
        raise engine_dead(engine.dead)
    return {"status": "ok", "requests": len(engine.engine.requests)}  # requests in the engine now


@router.get("/v1/models", response_model=None)
async def models(request: Request) -> dict:
    name = server_state(request).model_name
    return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "atom"}]}


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> dict | StreamingResponse:
    state = server_state(request)
    check_model(body.model, state.model_name)
    params = completion_params(body)
    prompt = {"prompt_token_ids": body.prompt} if isinstance(body.prompt, list) else body.prompt
    echo = await _as_text(state.engine, body.prompt) if body.echo else ""
    formatter_for = _formatter_for(state, params, chat=False, echo=echo)
    return await generate(state.engine, request, body, prompt, params, formatter_for)


@router.post("/v1/chat/completions", response_model=None)
async def chat(body: ChatCompletionRequest, request: Request) -> dict | StreamingResponse:
    state = server_state(request)
    check_model(body.model, state.model_name)
    ids, params = await chat_prompt(state.engine, body)
    formatter_for = _formatter_for(state, params, chat=True)
    return await generate(state.engine, request, body, {"prompt_token_ids": ids}, params, formatter_for)


def _formatter_for(state: ServerState, params: SamplingParams, *, chat: bool, echo: str = "") -> FormatterFor:
    """The request's Formatter, once generate() has given it an id and a creation time."""
    top_logprobs = params.logprobs or 0
    return partial(
        Formatter,
        state.engine.engine.tokenizer,
        state.model_name,
        chat=chat,
        echo=echo,
        top_logprobs=top_logprobs,
    )


async def _as_text(engine: AsyncEngine, prompt: str | list[int]) -> str:
    """The prompt as echo prefixes it: text as given, token ids decoded (to nothing without a tokenizer)."""
    if isinstance(prompt, str):
        return prompt
    tokenizer = engine.engine.tokenizer
    if tokenizer is None:
        return ""
    return await engine.run_tokenizer(lambda: tokenizer.decode(prompt, skip_special_tokens=True))
