"""/tokenize and /detokenize, as vLLM's server has them: a prompt (or a chat, through the template) to
the token ids the engine would run, and token ids back to text. Like vLLM's, they are not /v1 routes, so
the API key does not guard them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from atom_core.engine.async_engine import AsyncEngine
from atom_core.engine.text.chat_template import chat_prompt_ids
from atom_core.entrypoints.openai.errors import ApiError
from atom_core.entrypoints.openai.protocol import MAX_MESSAGES, ChatMessage, Text
from atom_core.entrypoints.openai.routes import Body, parse_body
from atom_core.entrypoints.openai.state import server_state
from atom_core.entrypoints.openai.validation import check_model

router = APIRouter()


class TokenizeRequest(BaseModel):
    """A prompt, or chat messages rendered by the chat template (with its generation prompt by default)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=MAX_MESSAGES)
    add_special_tokens: bool = True  # a prompt's BOS and the like (a chat's come from its template)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: Text | None = None
    tokens: list[int] = Field(max_length=1 << 20)


async def _checked(request: Request, model: type[Body]) -> tuple[Body, object, AsyncEngine]:
    """The request's body, the tokenizer and the engine; 4xx for a bad body, model or no tokenizer."""
    body = await parse_body(request, model)
    state = server_state(request)
    check_model(body.model, state.names)
    tokenizer = state.engine.engine.tokenizer
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: it takes and gives token ids only")
    return body, tokenizer, state.engine


@router.post("/tokenize", response_model=None)
async def tokenize(request: Request) -> dict:
    body, tokenizer, engine = await _checked(request, TokenizeRequest)

    def run() -> list[int]:
        if body.prompt is not None:
            if len(body.prompt) > engine.engine.max_prompt_chars:
                raise ValueError(
                    f"the prompt has {len(body.prompt)} characters: more than max_model_len can hold"
                )
            return tokenizer(body.prompt, add_special_tokens=body.add_special_tokens).input_ids
        messages = [m.for_template() for m in body.messages]
        return chat_prompt_ids(
            tokenizer,
            messages,
            add_generation_prompt=body.add_generation_prompt,
            template_kwargs=body.chat_template_kwargs,
        )

    try:
        ids = await engine.run_tokenizer(run)
    except ValueError as err:
        raise ApiError(400, str(err)) from err
    strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return {
        "count": len(ids),
        "max_model_len": engine.engine.max_model_len,
        "tokens": ids,
        "token_strs": strs,
    }


@router.post("/detokenize", response_model=None)
async def detokenize(request: Request) -> dict:
    body, tokenizer, engine = await _checked(request, DetokenizeRequest)
    vocab = engine.engine.model_config.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise ApiError(400, f"tokens must be integers in [0, {vocab})")
    return {"prompt": await engine.run_tokenizer(tokenizer.decode, body.tokens)}
