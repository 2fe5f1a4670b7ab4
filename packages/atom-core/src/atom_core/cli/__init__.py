"""The `atom` command line, in vLLM's shape: `atom serve [MODEL]`, `atom generate --model MODEL [PROMPT ...]`
and `atom bench --model MODEL`; with no model, the built-in demo checkpoint (random weights).
`atom bench-serve --base-url URL` benchmarks a running OpenAI-compatible server.

Arguments are checked before the engine (torch, transformers) is imported: a missing checkpoint dir or a
checkpoint given where a prompt goes fails at once, with one line.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn

from atom_core import __version__
from atom_core.cli import bench, bench_serve, generate, serve
from atom_core.cli.checks import check_arguments
from atom_core.cli.common import Help, Parser, one_line, say

COMMANDS = {"generate": generate, "serve": serve, "bench": bench, "bench-serve": bench_serve}


def build_parser() -> Parser:
    parser = Parser(prog="atom", description="ATOM: LLM inference", formatter_class=Help)
    parser.add_argument("--version", action="store_true", help="print package versions and exit")
    sub = parser.add_subparsers(dest="command")
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        import atom_kernels

        print(f"atom-core {__version__}, atom-kernels {atom_kernels.__version__}")
        return 0
    if args.command not in COMMANDS:
        parser.print_help()
        return 2
    problem = check_arguments(args)
    if problem is not None:  # before the engine (and torch) is imported: it fails at once
        say(f"error: {problem}")
        return 2
    try:
        return COMMANDS[args.command].run(args)
    except (ValueError, OSError) as err:  # a bad checkpoint, config or argument: the message says which
        say(f"error: {one_line(err)}")
        return 2


def run_program() -> NoReturn:
    """The `atom` program (its console script and `python -m atom_core.cli`): `main()`, the exit handlers,
    then the process ends at once. Python's own teardown would go on to unload torch, transformers and the
    engine's modules one by one, a second or more after the work is done (for `atom serve`, after its
    clients have their last answers), and a supervisor's shutdown grace period counts that second."""
    code = main()  # argparse's SystemExit (--help, a bad flag) comes before anything heavy is imported
    atexit._run_exitfuncs()  # what the teardown runs first: logging's flush, child processes' cleanup
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to flush to
            stream.flush()
    os._exit(code)
