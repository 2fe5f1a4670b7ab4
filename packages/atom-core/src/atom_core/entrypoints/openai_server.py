"""An OpenAI-compatible HTTP server over the async engine.

/v1/completions and /v1/chat/completions (both with SSE streaming), /v1/models, /health. A bad request
gets HTTP 400 with a message and nothing else is disturbed; an optional API key is checked as a bearer
token; one log line per request with its timing.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from atom_core.engine.async_engine import AsyncEngine
from atom_core.entrypoints.protocol import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger("atom.server")
MAX_N = 16


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def create_app(engine: AsyncEngine, model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="ATOM")
    tokenizer = engine.engine.tokenizer

    @app.middleware("http")
    async def auth_and_log(request: Request, call_next):
        start = time.perf_counter()
        if (
            api_key
            and request.url.path.startswith("/v1")
            and request.headers.get("authorization") != f"Bearer {api_key}"
        ):
            response = _error(401, "invalid or missing API key", "authentication_error")
        else:
            response = await call_next(request)
        logger.info("%s %s -> %d in %.1f ms", request.method, request.url.path, response.status_code,
                    (time.perf_counter() - start) * 1e3)  # fmt: skip
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "atom"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        prompt = {"prompt_token_ids": body.prompt} if isinstance(body.prompt, list) else body.prompt
        return await _serve(body, prompt, body.logprobs, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest):
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            return _error(400, "this model has no chat template")
        text = tokenizer.apply_chat_template([m.model_dump() for m in body.messages], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
        return await _serve(body, {"prompt_token_ids": tokenizer(text, add_special_tokens=False).input_ids}, None,
                            chat=True)  # fmt: skip

    async def _serve(body, prompt, logprobs, chat: bool):
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            params = body.sampling_params(logprobs, MAX_N)
            stream = engine.generate(prompt, params, request_id)
            first = await anext(stream)  # bad input raises here, before any byte is sent
        except ValueError as err:
            return _error(400, str(err))
        created = int(time.time())
        if body.stream:
            return StreamingResponse(
                _sse(first, stream, request_id, created, chat), media_type="text/event-stream"
            )
        final = first
        async for out in stream:
            final = out
        return _full_response(final, request_id, created, chat)

    def _full_response(out, request_id, created, chat):
        choices = []
        for c in out.outputs:
            choice = {"index": c.index, "finish_reason": c.finish_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
                choice["logprobs"] = _logprobs(c) if c.logprobs is not None else None
            choices.append(choice)
        completion_tokens = sum(len(c.token_ids) for c in out.outputs)
        return {
            "id": request_id, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": len(out.prompt_token_ids), "completion_tokens": completion_tokens,
                      "total_tokens": len(out.prompt_token_ids) + completion_tokens},
        }  # fmt: skip

    def _logprobs(c):
        return {
            "tokens": [tokenizer.decode([t]) if tokenizer else str(t) for t in c.token_ids],
            "token_logprobs": [lp.get(t) for t, lp in zip(c.token_ids, c.logprobs, strict=False)],
            "top_logprobs": [{(tokenizer.decode([k]) if tokenizer else str(k)): v for k, v in lp.items()}
                             for lp in c.logprobs],
        }  # fmt: skip

    async def _sse(first, stream, request_id, created, chat):
        sent, done = {}, set()
        obj = "chat.completion.chunk" if chat else "text_completion"
        out = first
        while True:
            for c in out.outputs:
                delta, sent[c.index] = c.text[len(sent.get(c.index, "")) :], c.text
                if c.index in done or (not delta and c.finish_reason is None):
                    continue
                if c.finish_reason is not None:
                    done.add(c.index)
                choice = {"index": c.index, "finish_reason": c.finish_reason}
                if chat:
                    choice["delta"] = {"role": "assistant", "content": delta}
                else:
                    choice["text"] = delta
                yield f"data: {json.dumps({'id': request_id, 'object': obj, 'created': created, 'model': model_name, 'choices': [choice]})}\n\n"
            if out.finished:
                break
            try:
                out = await anext(stream)
            except StopAsyncIteration:
                break
        yield "data: [DONE]\n\n"

    return app
