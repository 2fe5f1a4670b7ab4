"""Errors in OpenAI's envelope, with nothing internal in a message.

A handler refuses a request by raising ApiError anywhere below it (checks stay one-liners, no response
threaded back up); install_error_handlers answers that, a body failing its schema, an unknown route or
method, and any crash, all in the same envelope.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from atom_core.engine.async_engine import EngineDead, ReaderTooSlow, RequestFailed, ShuttingDown
from atom_core.entrypoints.openai.responses import error_body
from atom_core.entrypoints.openai.schema_errors import schema_error

logger = logging.getLogger("atom.server")


def error_response(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind, code, param), status_code=status)


class ApiError(Exception):
    """A request refused (4xx) or failed (5xx); answered as error_response(status, message, kind, code)."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


def engine_dead(reason: str) -> ApiError:
    return ApiError(503, f"the engine is dead: {reason}", "service_unavailable")


# how a request admitted to the engine can end without finishing
ENDED = (RequestFailed, EngineDead, ReaderTooSlow, ShuttingDown)


def engine_failure(err: Exception) -> ApiError:
    """A dead engine or a shutdown is the server's state (503); a failed request is this request's alone
    (500); a reader that stopped reading was dropped (499)."""
    if isinstance(err, EngineDead):
        return engine_dead(str(err))
    if isinstance(err, ShuttingDown):
        return ApiError(503, str(err), "service_unavailable")  # the reason says it shuts down
    if isinstance(err, ReaderTooSlow):
        return ApiError(499, f"the client stopped reading: {err}")
    return ApiError(500, f"the engine failed this request: {err}", "internal_error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal)


async def _api_error(request: Request, err: ApiError) -> JSONResponse:
    return error_response(err.status, err.message, err.kind, err.code)


async def _invalid_body(request: Request, err: RequestValidationError) -> JSONResponse:
    """The first problem, in OpenAI's words and with its param (schema_errors.py)."""
    problem = schema_error(list(err.errors()))
    return error_response(400, problem.message, code=problem.code, param=problem.param)


async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    """Starlette's own errors: an unknown route (404), a wrong method (405)."""
    kind = "invalid_request_error" if err.status_code < 500 else "error"
    return error_response(err.status_code, str(err.detail), kind)


async def _internal(request: Request, err: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal server error", "internal_error")
