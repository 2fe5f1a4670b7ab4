"""`atom serve [MODEL]`: the OpenAI-compatible server, as `vllm serve MODEL`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from atom_core.cli.common import Help, configure_logging, port, say, with_engine_args
from atom_core.entrypoints.openai.limits import ServerLimits


def add_parser(sub) -> None:
    serve = with_engine_args(
        sub.add_parser(
            "serve",
            help="OpenAI-compatible HTTP server (default: the built-in demo model)",
            formatter_class=Help,
        )
    )
    serve.add_argument(
        "model_tag",
        nargs="?",
        type=Path,
        metavar="MODEL",
        help="the checkpoint dir to serve (as `vllm serve MODEL`; or --model)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    serve.add_argument("--port", type=port, default=8000, help="0..65535 (default: 8000)")
    serve.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer <key>' on /v1 routes "
        "(visible to other local users: prefer --api-key-file or ATOM_API_KEY)",
    )
    serve.add_argument("--api-key-file", type=Path, default=None, help="read the API key from this file")
    serve.add_argument(
        "--reasoning-parser",
        default="auto",
        choices=("auto", "none", "qwen3", "deepseek_r1", "harmony"),
        help="give chat answers' <think> part as reasoning_content (auto: by the model family, where the "
        "tokenizer has the tags)",
    )
    serve.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=("auto", "none", "hermes", "qwen3_coder", "deepseek_v3", "harmony"),
        help="how tool_choice \"auto\" answers' calls are read (auto: from the chat template's own call "
        "format, where a parser knows it)",
    )
    serve.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="the model's names in the API; answers carry the first (default: MODEL as given)",
    )
    limits = ServerLimits()
    serve.add_argument("--max-request-bytes", type=int, default=limits.max_body_bytes, help="413 above this")
    serve.add_argument(
        "--max-discard-bytes",
        type=int,
        default=limits.max_discard_bytes,
        help="a body over --max-request-bytes is read (and dropped) up to this size before its 413, "
        "so that clients sending it whole get the 413, not a reset",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=limits.request_timeout,
        help="seconds a client has to send a request's head once begun, then its body",
    )
    serve.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=limits.keep_alive_timeout,
        help="seconds a connection may wait with no request begun (new, or after a response)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=limits.max_connections,
        help="open connections; at this many a new one closes the one idle longest (refused if none is)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=limits.shutdown_timeout,
        help="seconds in-flight requests get after SIGTERM",
    )
    serve.add_argument(
        "--max-stream-buffer-tokens",
        type=int,
        default=limits.max_stream_buffer_tokens,
        help="a stream whose client leaves this many tokens unread is dropped (499 in the log)",
    )


def _api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else --api-key-file, else $ATOM_API_KEY; an empty key is refused, not taken as none."""
    if args.api_key is not None:
        key, where = args.api_key, "--api-key"
    elif args.api_key_file is not None:
        try:
            key, where = args.api_key_file.read_text().strip(), str(args.api_key_file)
        except OSError as err:
            raise ValueError(f"--api-key-file {args.api_key_file}: {err.strerror}") from None
    elif "ATOM_API_KEY" in os.environ:
        key, where = os.environ["ATOM_API_KEY"], "ATOM_API_KEY"
    else:
        return None
    if not key.strip():
        raise ValueError(f"the API key from {where} is empty: give a real key, or none to serve without one")
    if not _sendable(key.strip()):  # the key itself is never printed
        raise ValueError(
            f"the API key from {where} has a non-ASCII or control character: HTTP headers carry printable "
            "ASCII, so no client could send it"
        )
    return key.strip()


def _sendable(key: str) -> bool:
    """Whether a client can send key in an Authorization header: printable ASCII only (a header's bytes
    are read as latin-1, so a UTF-8 key could never match)."""
    return key.isascii() and key.isprintable()


def run(args: argparse.Namespace) -> int:
    from atom_core.entrypoints.openai.startup import bind_socket

    api_key = _api_key(args)
    limits = ServerLimits(
        max_body_bytes=args.max_request_bytes,
        max_discard_bytes=args.max_discard_bytes,
        request_timeout=args.request_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections,
        shutdown_timeout=args.shutdown_timeout,
        max_stream_buffer_tokens=args.max_stream_buffer_tokens,
    )
    sock = bind_socket(args.host, args.port)  # before the model loads: a busy port fails at once
    try:
        return _serve_on(args, sock, api_key, limits)
    finally:
        sock.close()


def _serve_on(args: argparse.Namespace, sock, api_key: str | None, limits: ServerLimits) -> int:
    import functools
    import logging
    import threading

    from atom_core.demo import ensure_demo_checkpoint
    from atom_core.engine import EngineConfig, LLMEngine
    from atom_core.engine.async_engine import AsyncEngine
    from atom_core.entrypoints.openai.app import create_app
    from atom_core.entrypoints.openai.connections import Server, make_server
    from atom_core.entrypoints.openai.parser_choice import chosen_parsers
    from atom_core.entrypoints.openai.startup import address_of, startup_lines

    configure_logging(args.log_level)
    log = logging.getLogger("atom.server")
    model_dir = args.model or ensure_demo_checkpoint(log=say)
    if args.model is None:
        say("serving the built-in demo checkpoint: RANDOM weights, so its text is meaningless")
    engine = LLMEngine(EngineConfig.from_cli_args(args, model=model_dir))
    names = args.served_model_name or [str(args.model) if args.model else "atom-demo"]
    name = names[0]
    reasoning, tool_parser = chosen_parsers(engine, args.reasoning_parser, args.tool_call_parser)
    for line in startup_lines(engine, name, reasoning, tool_parser):
        log.info("%s", line)
    server: list[Server] = []
    async_engine = AsyncEngine(
        engine,
        on_dead=lambda reason: setattr(server[0], "should_exit", True),
        max_buffered_tokens=limits.max_stream_buffer_tokens,
    )
    closing = threading.Event()
    app = create_app(
        async_engine,
        names,
        api_key=api_key,
        limits=limits,
        closing=closing,
        reasoning_parser=reasoning,
        tool_parser=tool_parser,
    )
    end = functools.partial(async_engine.fail_all, "the server is shutting down")
    address = address_of(sock)
    ready = functools.partial(log.info, "ready: serving %s at %s/v1", name, address)
    server.append(
        make_server(app, args.host, args.port, limits, closing=closing.set, end_requests=end, on_ready=ready)
    )
    try:
        server[0].run(sockets=[sock])
    finally:
        async_engine.shutdown()
        engine.shutdown()
    if async_engine.dead is not None:
        say(f"error: the engine is dead, so the server stopped: {async_engine.dead}")
        return 1
    return 0
