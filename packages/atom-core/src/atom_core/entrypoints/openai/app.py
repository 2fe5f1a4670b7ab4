"""The OpenAI-compatible HTTP app: routes, the API key, and errors in OpenAI's envelope.

/v1/completions and /v1/chat/completions (streaming or not), /v1/models, /health, /metrics (Prometheus),
/tokenize and /detokenize. A request is
validated whole before it reaches the engine; a bad one gets 4xx naming the problem; a request the engine
fails gets 500 with the reason; nothing else is disturbed. A non-streaming request whose client leaves
is aborted. No interactive docs or schema routes are served.

This module only assembles the app; its parts are routes.py (the handlers), validation.py (checks beyond
the body's schema), generation.py and streaming.py (running a request to its answer), errors.py (the
envelope), access.py (API key and access log) and limits.py (request bodies).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from fastapi import FastAPI

from atom_core.engine.async_engine import AsyncEngine
from atom_core.entrypoints.openai.access import auth_and_log
from atom_core.entrypoints.openai.errors import install_error_handlers
from atom_core.entrypoints.openai.harmony import HarmonyVocab
from atom_core.entrypoints.openai.limits import BodyLimit, ServerLimits
from atom_core.entrypoints.openai.metrics import ServingMetrics
from atom_core.entrypoints.openai.reasoning import NAMES as REASONING_NAMES
from atom_core.entrypoints.openai.routes import router
from atom_core.entrypoints.openai.state import ServerState
from atom_core.entrypoints.openai.tokenization import router as tokenization_router
from atom_core.entrypoints.openai.tool_calls import PARSERS as TOOL_PARSERS


def create_app(
    engine: AsyncEngine,
    model_name: str | Sequence[str],
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    closing: threading.Event | None = None,
    reasoning_parser: str | None = None,
    tool_parser: str | None = None,
) -> BodyLimit:
    """The ASGI app serving `engine` as `model_name` (FastAPI inside the body-limit middleware): a name, or
    several a request may ask for (answers carry the first, as vLLM's do); once `closing` is set, new
    requests get 503."""
    names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"served model names must be given and distinct, got {list(names)}")
    if api_key is not None and not api_key.strip():
        raise ValueError("the API key is empty: give a real key, or none to serve without one")
    if api_key is not None and not (api_key.isascii() and api_key.isprintable()):  # never sendable
        raise ValueError(
            "the API key has a non-ASCII or control character: HTTP headers carry printable ASCII"
        )
    if reasoning_parser is not None and reasoning_parser not in REASONING_NAMES:
        raise ValueError(f"reasoning parser {reasoning_parser!r} is not one of {', '.join(REASONING_NAMES)}")
    if tool_parser is not None and tool_parser not in TOOL_PARSERS:
        raise ValueError(f"tool-call parser {tool_parser!r} is not one of {', '.join(TOOL_PARSERS)}")
    harmony = None
    if "harmony" in (reasoning_parser, tool_parser):
        harmony = HarmonyVocab.of(engine.engine.tokenizer)
        if harmony is None:
            raise ValueError(
                "the harmony parser reads the markers <|channel|>, <|message|>, ... as tokens, and this "
                "model's tokenizer lacks them"
            )
    app = FastAPI(title="ATOM", docs_url=None, redoc_url=None, openapi_url=None)
    # (after every check: a refused app leaves the engine without an observer)
    metrics = ServingMetrics(engine.engine, names[0])
    engine.engine.observe_requests(metrics)
    app.state.server = ServerState(
        engine,
        names[0],
        api_key,
        closing or threading.Event(),
        metrics,
        names,
        reasoning_parser,
        tool_parser,
        harmony,
    )
    install_error_handlers(app)
    app.middleware("http")(auth_and_log)
    app.include_router(router)
    app.include_router(tokenization_router)
    return BodyLimit(app, limits or ServerLimits())
