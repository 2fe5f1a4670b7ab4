"""The `atom` command line, in vLLM's shape: `atom serve [MODEL]`, `atom generate --model MODEL [PROMPT ...]`
and `atom bench --model MODEL`; with no model, the built-in demo checkpoint (random weights).

Arguments are checked before the engine (torch, transformers) is imported: a missing checkpoint dir or a
checkpoint given where a prompt goes fails at once, with one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from atom_core import __version__
from atom_core.entrypoints.openai.limits import ServerLimits

# what `atom generate` samples with where neither a flag nor the checkpoint's generation config says
GENERATE_FALLBACKS = {"temperature": 0.0, "max_tokens": 32}


def _log(message: str) -> None:
    print(f"[atom] {message}", file=sys.stderr, flush=True)


def _parse_token_ids(raw: str) -> list[int]:
    try:
        ids = [int(t) for t in raw.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-token-ids wants integers, got {raw!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-token-ids is empty")
    return ids


def _port(raw: str) -> int:
    """A TCP port: 0 (the system picks a free one) to 65535; anything else is refused by argparse,
    not by the bind after the model has loaded."""
    try:
        port = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a TCP port (0..65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0..65535, 0: any free one)")
    return port


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help lines with their defaults, where a default says something (not None, False or inf)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, math.inf, argparse.SUPPRESS) or not action.option_strings:
            return action.help or ""
        return super()._get_help_string(action)


def _looks_like_a_checkpoint(text: str) -> bool:
    """Whether a positional prompt is a path instead: an existing directory, or one word written as a
    path (./x, ../x, /x, ~/x, x/)."""
    if Path(text).expanduser().is_dir():
        return True
    return not any(c.isspace() for c in text) and (
        text.startswith(("./", "../", "/", "~/")) or text.endswith("/")
    )


def _model_error(model: Path | None) -> str | None:
    """Why `model` cannot be a checkpoint dir (checked before anything heavy is imported), or None."""
    if model is None:
        return None
    if not model.exists():
        return (
            f"{model}: no such checkpoint dir (ATOM loads a checkpoint from a local directory; "
            "it downloads nothing)"
        )
    if not model.is_dir():
        return f"{model} is a file, not a checkpoint dir (give the directory that holds config.json)"
    if not (model / "config.json").is_file():
        return f"{model} is not a checkpoint dir (no config.json)"
    return None


def _with_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every engine option (EngineConfig's), the same for generate, serve and bench."""
    from atom_core.engine.config import EngineConfig

    return EngineConfig.add_cli_args(parser)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atom", description="ATOM: LLM inference", formatter_class=_Help)
    parser.add_argument("--version", action="store_true", help="print package versions and exit")
    sub = parser.add_subparsers(dest="command")
    gen = _with_engine_args(
        sub.add_parser(
            "generate",
            help="complete prompts on a checkpoint (greedy unless --temperature or the checkpoint's "
            "generation_config.json says otherwise; default: the built-in demo)",
            formatter_class=_Help,
        )
    )
    gen.add_argument(
        "prompts",
        nargs="*",
        metavar="PROMPT",
        help="prompts to complete (as vLLM's LLM.generate); the checkpoint goes in --model",
    )
    gen.add_argument("--prompt", action="append", help="a prompt; repeat for several")
    gen.add_argument(
        "--prompt-token-ids", action="append", type=_parse_token_ids, help="a prompt as token ids: '1,2,3'"
    )
    # unset sampling flags take the checkpoint's generation_config.json values (--generation-config auto),
    # else the fallbacks below: greedy, 32 tokens
    gen.add_argument(
        "--max-tokens",
        type=int,
        help="tokens generated per prompt, at most (default: the checkpoint's, else 32)",
    )
    gen.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature, 0: greedy (default: the checkpoint's, else 0)",
    )
    gen.add_argument("--top-p", type=float, help="nucleus sampling: the top tokens' mass kept (default: all)")
    gen.add_argument("--top-k", type=int, help="the k most likely tokens kept, -1: all (default: all)")
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    serve = _with_engine_args(
        sub.add_parser(
            "serve",
            help="OpenAI-compatible HTTP server (default: the built-in demo model)",
            formatter_class=_Help,
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
    serve.add_argument("--port", type=_port, default=8000, help="0..65535 (default: 8000)")
    serve.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer <key>' on /v1 routes "
        "(visible to other local users: prefer --api-key-file or ATOM_API_KEY)",
    )
    serve.add_argument("--api-key-file", type=Path, default=None, help="read the API key from this file")
    serve.add_argument(
        "--served-model-name", default=None, help="the model's name in the API (default: MODEL as given)"
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
    bench = _with_engine_args(
        sub.add_parser(
            "bench",
            help="offline throughput and latency (default: the built-in demo model)",
            formatter_class=_Help,
        )
    )
    bench.add_argument("--num-prompts", type=int, default=32, help="requests, of random token ids")
    bench.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    bench.add_argument("--output-len", type=int, default=64, help="tokens generated per request")
    bench.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="requests arriving a second, as a Poisson process (default: all at once)",
    )
    bench.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    bench.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the top tokens' mass kept")
    bench.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser


def _bench(args: argparse.Namespace) -> int:
    from atom_core.demo import ensure_demo_checkpoint
    from atom_core.engine import EngineConfig, LLMEngine, SamplingParams
    from atom_core.entrypoints.bench import run_bench

    if min(args.num_prompts, args.input_len, args.output_len) < 1:
        _log("--num-prompts, --input-len and --output-len must be at least 1")
        return 2
    if not args.request_rate > 0:
        _log(f"--request-rate must be positive, got {args.request_rate}")
        return 2
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p)  # (seeded by --seed)
    except ValueError as err:
        _log(str(err))
        return 2
    model_dir = args.model or ensure_demo_checkpoint(log=_log)
    max_model_len = args.max_model_len or args.input_len + args.output_len + 8
    engine = LLMEngine(EngineConfig.from_cli_args(args, model=model_dir, max_model_len=max_model_len))
    try:
        result = run_bench(
            engine,
            num_prompts=args.num_prompts,
            input_len=args.input_len,
            output_len=args.output_len,
            request_rate=args.request_rate,
            params=params,
        )
    finally:
        engine.shutdown()
    print(json.dumps(result.as_dict()) if args.json else result.table())
    return 0


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


def _serve(args: argparse.Namespace) -> int:
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
    from atom_core.entrypoints.openai.startup import address_of, startup_lines

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("atom.server")
    model_dir = args.model or ensure_demo_checkpoint(log=_log)
    if args.model is None:
        _log("serving the built-in demo checkpoint: RANDOM weights, so its text is meaningless")
    engine = LLMEngine(EngineConfig.from_cli_args(args, model=model_dir))
    name = args.served_model_name or (str(args.model) if args.model else "atom-demo")
    for line in startup_lines(engine, name):
        log.info("%s", line)
    server: list[Server] = []
    async_engine = AsyncEngine(
        engine,
        on_dead=lambda reason: setattr(server[0], "should_exit", True),
        max_buffered_tokens=limits.max_stream_buffer_tokens,
    )
    closing = threading.Event()
    app = create_app(async_engine, name, api_key=api_key, limits=limits, closing=closing)
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
        _log(f"error: the engine is dead, so the server stopped: {async_engine.dead}")
        return 1
    return 0


def _generate(args: argparse.Namespace) -> int:
    from atom_core.demo import ensure_demo_checkpoint
    from atom_core.engine import LLM, EngineConfig, SamplingParams

    # (--seed is the engine's: it seeds every prompt, as vLLM's)
    flags = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens)
    given = {k: v for k, v in flags.items() if v is not None} | {"ignore_eos": args.ignore_eos}
    try:
        SamplingParams(**{**GENERATE_FALLBACKS, **given})  # the flags checked before the model loads
    except ValueError as err:
        _log(str(err))
        return 2
    model_dir = args.model or ensure_demo_checkpoint(log=_log)
    if args.model is None:
        _log("using the built-in demo checkpoint: RANDOM weights, so the text below is meaningless")
    llm = LLM.from_engine_config(EngineConfig.from_cli_args(args, model=model_dir))
    params = SamplingParams(**{**GENERATE_FALLBACKS, **llm.engine.generation_defaults, **given})
    prompts: list = [*args.prompts, *(args.prompt or [])] + [
        {"prompt_token_ids": ids} for ids in args.prompt_token_ids or []
    ]
    if not prompts:
        prompts = ["Paged attention keeps", "The quick brown fox"]
    try:
        outputs = llm.generate(prompts, params)
    except ValueError as err:
        _log(str(err))
        return 2
    finally:
        llm.shutdown()
    failed = 0
    for out in outputs:
        completion = out.outputs[0]
        if out.error is not None:  # the engine failed this request: said, and the exit status says so
            shown = out.prompt if out.prompt is not None else out.prompt_token_ids
            _log(f"error: the request for {shown!r} failed: {out.error}")
            failed += 1
            continue
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": out.prompt,
                        "prompt_token_ids": out.prompt_token_ids,
                        "token_ids": completion.token_ids,
                        "text": completion.text,
                        "finish_reason": completion.finish_reason,
                    }
                )
            )
        else:
            shown = out.prompt if out.prompt is not None else out.prompt_token_ids
            print(f"{shown!r} -> {completion.text!r}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.version:
        import atom_kernels

        print(f"atom-core {__version__}, atom-kernels {atom_kernels.__version__}")
        return 0
    commands = {"generate": _generate, "serve": _serve, "bench": _bench}
    if args.command not in commands:
        parser.print_help()
        return 2
    problem = _check_arguments(args)
    if problem is not None:  # before the engine (and torch) is imported: it fails at once
        _log(f"error: {problem}")
        return 2
    try:
        return commands[args.command](args)
    except (ValueError, OSError) as err:  # a bad checkpoint, config or argument: the message says which
        _log(f"error: {_one_line(err)}")
        return 2


def _check_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line that needs no engine to see, or None. Sets args.model from
    serve's positional MODEL."""
    if args.command == "serve" and args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            return f"two models given: MODEL {args.model_tag} and --model {args.model}; give one"
        args.model = args.model_tag
    if args.model is not None:
        args.model = args.model.expanduser()
    if args.command == "generate":
        for prompt in args.prompts:
            if _looks_like_a_checkpoint(prompt):
                return (
                    f"{prompt!r} looks like a checkpoint dir, not a prompt: give it as --model {prompt} "
                    "(positional arguments are prompts)"
                )
    return _model_error(args.model)


def _one_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
