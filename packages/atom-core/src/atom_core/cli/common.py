"""What every `atom` command shares: its messages, its argument parser and the value types of its flags."""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def say(message: str) -> None:
    print(f"[atom] {message}", file=sys.stderr, flush=True)


def one_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return " ".join(text.split())


class Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one `[atom] error:` line (where to look for help included)
    and exit status 2, as every other mistake the CLI reports."""

    def error(self, message: str) -> NoReturn:
        say(f"error: {message} (see {self.prog} --help)")
        sys.exit(2)


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help lines with their defaults, where a default says something (not None, False or inf) and the
    help text does not give it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, math.inf, argparse.SUPPRESS) or not action.option_strings:
            return text
        if "default" in text:
            return text
        return super()._get_help_string(action)


def parse_token_ids(raw: str) -> list[int]:
    try:
        ids = [int(t) for t in raw.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-token-ids wants integers, got {raw!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-token-ids is empty")
    return ids


def port(raw: str) -> int:
    """A TCP port: 0 (the system picks a free one) to 65535; anything else is refused by argparse,
    not by the bind after the model has loaded."""
    try:
        port = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a TCP port (0..65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0..65535, 0: any free one)")
    return port


def with_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every engine option (EngineConfig's), the same for generate, serve and bench, and --log-level."""
    from atom_core.engine.config import EngineConfig

    parser.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="what ATOM's and the server's loggers print"
    )
    return EngineConfig.add_cli_args(parser)


def configure_logging(level: str) -> None:
    """ATOM's loggers (atom.engine, atom.server, ...) and the HTTP server's at `level`, one format."""
    import logging

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
