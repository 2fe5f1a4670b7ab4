"""What a request must satisfy beyond its body's schema (protocol.py): the model it names, its sampling
fields together, and a chat's prompt fitting the model. Each refusal is a 400/404 ApiError naming the
problem, raised before the engine sees the request."""

from __future__ import annotations

from functools import partial

from atom_core.engine.async_engine import AsyncEngine
from atom_core.engine.sampling_params import SamplingParams
from atom_core.engine.text.chat_template import chat_prompt_ids
from atom_core.entrypoints.openai.errors import ApiError
from atom_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest


def check_model(asked: str | None, served: tuple[str, ...]) -> None:
    """No model named means the one served; a named one must be one of its names."""
    if asked is not None and asked not in served:
        names = ", ".join(repr(n) for n in served)
        raise ApiError(
            404, f"the model {asked!r} does not exist (this server serves {names})", code="model_not_found"
        )


def completion_params(body: CompletionRequest, defaults: dict) -> SamplingParams:
    """defaults: the checkpoint's sampling defaults (LLMEngine.generation_defaults), for unset fields."""
    try:
        return body.checked_params(defaults)
    except ValueError as err:
        raise ApiError(400, str(err)) from err


async def chat_prompt(
    engine: AsyncEngine, body: ChatCompletionRequest, harmony: bool = False
) -> tuple[list[int], SamplingParams]:
    """The chat's prompt token ids, and its sampling params (whose default budget is the room left;
    harmony: the answer is in the harmony format, which its constraints are held to)."""
    tokenizer = engine.engine.tokenizer
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer, so no chat template")
    messages = [m.for_template() for m in body.messages]
    # refused on its size before the tokenizer spends time on it
    if (chars := sum(len(m["content"] or "") for m in messages)) > engine.engine.max_prompt_chars:
        raise ApiError(
            400,
            f"the messages have {chars} characters: more than max_model_len "
            f"{engine.engine.max_model_len} tokens can hold",
        )
    try:
        kwargs, tools = body.template_kwargs(), body.template_tools()
        if body.reasoning_effort is not None and "reasoning_effort" not in str(tokenizer.chat_template):
            raise ValueError(
                f"reasoning_effort {body.reasoning_effort!r}: this model's chat template reads no "
                "reasoning_effort variable, so nothing would set its reasoning"
            )
        ids = await engine.run_tokenizer(
            partial(chat_prompt_ids, template_kwargs=kwargs, tools=tools), tokenizer, messages
        )
        room = engine.engine.max_model_len - len(ids)
        return ids, body.checked_params(
            room=room, defaults=engine.engine.generation_defaults, harmony=harmony
        )
    except ValueError as err:
        raise ApiError(400, str(err)) from err
