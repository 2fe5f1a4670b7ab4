"""The OpenAI-compatible HTTP app: routes, the API key, and errors in OpenAI's envelope.

/v1/completions and /v1/chat/completions (streaming or not), /v1/models, /health. A request is
validated whole before it reaches the engine; a bad one gets 4xx naming the problem; a request the engine
fails gets 500 with the reason; nothing else is disturbed. A non-streaming request whose client leaves
is aborted. No interactive docs or schema routes are served.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from atom_core.engine.async_engine import AsyncEngine, EngineDead, RequestFailed
from atom_core.entrypoints.openai.chat import chat_prompt_ids
from atom_core.entrypoints.openai.limits import BodyLimit, ServerLimits
from atom_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from atom_core.entrypoints.openai.responses import Formatter, error_body
from atom_core.entrypoints.openai.streaming import stream_events

logger = logging.getLogger("atom.server")


def _error(
    status: int, message: str, kind: str = "invalid_request_error", code: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind, code), status_code=status)


def authorized(header: str | None, api_key: str) -> bool:
    """`Authorization: Bearer <key>` (the scheme in any case), compared in constant time."""
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def create_app(
    engine: AsyncEngine, model_name: str, api_key: str | None = None, limits: ServerLimits | None = None
) -> BodyLimit:
    """The ASGI app serving `engine` as `model_name` (FastAPI inside the body-limit middleware)."""
    if api_key is not None and not api_key.strip():
        raise ValueError("the API key is empty: give a real key, or none to serve without one")
    app = FastAPI(title="ATOM", docs_url=None, redoc_url=None, openapi_url=None)
    _errors(app)

    @app.middleware("http")
    async def auth_and_log(request: Request, call_next):
        start = time.perf_counter()
        if (
            api_key
            and request.url.path.startswith("/v1")
            and not authorized(request.headers.get("authorization"), api_key)
        ):
            response = _error(401, "invalid or missing API key", "authentication_error")
        else:
            response = await call_next(request)
        logger.info(
            "%s %s -> %d in %.1f ms",
            request.method,
            request.url.path,
            response.status_code,
            (time.perf_counter() - start) * 1e3,
        )
        return response

    @app.get("/health")
    async def health():
        if engine.dead is not None:
            return _error(503, f"the engine is dead: {engine.dead}", "service_unavailable")
        return {"status": "ok", "requests": len(engine.engine.requests)}  # requests in the engine now

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "atom"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if (refused := _check_model(body.model, model_name)) is not None:
            return refused
        try:
            params = body.checked_params()
        except ValueError as err:
            return _error(400, str(err))
        prompt = {"prompt_token_ids": body.prompt} if isinstance(body.prompt, list) else body.prompt
        echo = ""
        if body.echo:
            echo = body.prompt if isinstance(body.prompt, str) else await _decode(engine, body.prompt)
        top = params.logprobs or 0
        return await _serve(
            engine,
            request,
            body,
            prompt,
            params,
            lambda rid, t: Formatter(
                engine.engine.tokenizer, model_name, rid, t, chat=False, echo=echo, top_logprobs=top
            ),
        )

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        if (refused := _check_model(body.model, model_name)) is not None:
            return refused
        tokenizer = engine.engine.tokenizer
        if tokenizer is None:
            return _error(400, "this model has no tokenizer, so no chat template")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        if (chars := sum(len(m["content"]) for m in messages)) > engine.engine.max_prompt_chars:
            return _error(
                400,
                f"the messages have {chars} characters: more than max_model_len "
                f"{engine.engine.max_model_len} tokens can hold",
            )
        try:
            ids = await engine.run_tokenizer(chat_prompt_ids, tokenizer, messages)
            params = body.checked_params(room=engine.engine.max_model_len - len(ids))
        except ValueError as err:
            return _error(400, str(err))
        top = params.logprobs or 0
        return await _serve(
            engine,
            request,
            body,
            {"prompt_token_ids": ids},
            params,
            lambda rid, t: Formatter(tokenizer, model_name, rid, t, chat=True, top_logprobs=top),
        )

    return BodyLimit(app, limits or ServerLimits())


def _check_model(asked: str | None, served: str) -> JSONResponse | None:
    if asked is None or asked == served:
        return None
    return _error(
        404, f"the model {asked!r} does not exist (this server serves {served!r})", code="model_not_found"
    )


async def _decode(engine: AsyncEngine, ids: list[int]) -> str:
    tokenizer = engine.engine.tokenizer
    if tokenizer is None:
        return ""
    return await engine.run_tokenizer(lambda: tokenizer.decode(ids, skip_special_tokens=True))


async def _serve(engine: AsyncEngine, request: Request, body, prompt, params, formatter):
    kind = "chatcmpl" if isinstance(body, ChatCompletionRequest) else "cmpl"
    request_id = f"{kind}-{uuid.uuid4().hex}"
    fmt = formatter(request_id, int(time.time()))
    try:
        stream = engine.generate(prompt, params, request_id)
        first = await anext(stream)  # bad input raises here, before any byte is sent
    except ValueError as err:
        return _error(400, str(err))
    except (RequestFailed, EngineDead) as err:
        return _failed(err)
    if body.stream:
        return StreamingResponse(
            stream_events(first, stream, fmt, include_usage=body.include_usage),
            media_type="text/event-stream",
        )
    collect = asyncio.ensure_future(_last(first, stream))
    gone = asyncio.ensure_future(_client_gone(request))
    await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not collect.done():  # the client left: stop the work (the stream's close aborts the request)
        collect.cancel()
        await asyncio.gather(collect, return_exceptions=True)
        return _error(499, "the client closed the connection")
    gone.cancel()
    try:
        return fmt.full(collect.result())
    except (RequestFailed, EngineDead) as err:
        return _failed(err)


def _failed(err: Exception) -> JSONResponse:
    if isinstance(err, EngineDead):
        return _error(503, f"the engine is dead: {err}", "service_unavailable")
    return _error(500, f"the engine failed this request: {err}", "internal_error")


async def _last(first, stream):
    final = first
    async for out in stream:
        final = out
    return final


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body was read already, so receive() waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _errors(app: FastAPI) -> None:
    """Every error in OpenAI's envelope; nothing internal in a message."""

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        message = first.get("msg", "invalid request")
        if first.get("type") == "extra_forbidden":
            message = "this field is not supported"
        elif first.get("type") == "json_invalid":
            message = "the body is not valid JSON"
        return _error(400, f"{where}: {message}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        return _error(
            err.status_code, str(err.detail), "invalid_request_error" if err.status_code < 500 else "error"
        )

    @app.exception_handler(Exception)
    async def internal(request: Request, err: Exception):
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "internal server error", "internal_error")
