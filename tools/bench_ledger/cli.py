"""`python -m benchmarks run NAME [NAME...] [-- ARGS...]`, `list` and `report`, for one package."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tools.bench_ledger import ledger
from tools.bench_ledger.registry import Bench
from tools.bench_ledger.report import render

OUTPUT_KEPT = 20_000  # characters of a sweep's printed output kept in its record


class _Tee(io.TextIOBase):
    """Writes through to a stream and keeps a copy."""

    def __init__(self, stream):
        self.stream, self.kept = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run_one(
    name: str,
    bench: Bench,
    args: list[str],
    package: Path,
    ceilings: Callable[[], tuple[float, float]] | None,
    label: str | None,
    baseline: bool = False,
) -> Path | None:
    """Run one benchmark's main() with args as its command line and append its record; under torchrun only
    rank 0 records (returns None on the others)."""
    module = importlib.import_module(f"benchmarks.{bench.module}")
    device, slug = ledger.current_device(bench.gpus)
    commit, dirty = ledger.commit_of(package)
    started, date = time.monotonic(), ledger.now()
    tee = _Tee(sys.stdout)
    argv, sys.argv = sys.argv, [f"{bench.module}.py", *args]
    try:
        with contextlib.redirect_stdout(tee):
            result = module.main()
    finally:
        sys.argv = argv
    measured = ledger.ceilings_in(result)
    if not measured and ceilings is not None and device != "cpu":
        copy, mm = ceilings()  # the harness caches them: a benchmark that measured them costs nothing more
        measured = {"copy_tb_s": copy / 1e12, "bf16_mm_tflops": mm / 1e12}
    record = {
        "bench": name,
        "date": date,
        "commit": commit,
        "dirty": dirty,
        "device": device,
        "args": args,
        "ceilings": measured,
        "seconds": round(time.monotonic() - started, 1),
        "result": result,
    }
    if label:
        record["label"] = label
    if baseline:  # a reference to compare with (older sources, a path turned off), not the package's figure
        record["baseline"] = True
    if result is None:
        record["output"] = tee.kept.getvalue()[-OUTPUT_KEPT:]
    if os.environ.get("RANK", "0") != "0":
        return None
    return ledger.append(package / "benchmarks" / "results", slug, name, record)


def main(
    benches: dict[str, Bench],
    package: Path,
    title: str,
    ceilings: Callable[[], tuple[float, float]] | None = None,
    argv: list[str] | None = None,
) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run benchmarks and append their records to the ledger")
    run.add_argument("names", nargs="+", help="registered names (see `list`)")
    run.add_argument("--label", help="a tag kept in each record (e.g. before / after a change)")
    run.add_argument(
        "--baseline",
        action="store_true",
        help="a reference run (older sources, a path turned off): kept, never the report's latest figure",
    )
    sub.add_parser("list", help="the registered benchmarks and their targets")
    report = sub.add_parser("report", help="write PERFORMANCE.md from the ledgers")
    report.add_argument("--check", action="store_true", help="exit 1 if PERFORMANCE.md is not up to date")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, bench in benches.items():
            print(f"{name:24} {bench.module}.py: {bench.what}")
            for target in bench.targets:
                print(f"{'':24}   target: {target.what} ({target.metric})")
        return 0
    if args.command == "report":
        text = render(title, benches, package / "benchmarks" / "results")
        path = package / "PERFORMANCE.md"
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{path} is not the report of the ledgers: run `python -m benchmarks report`")
                return 1
            return 0
        path.write_text(text)
        print(f"wrote {path}")
        return 0
    unknown = [n for n in args.names if n not in benches]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; registered: {', '.join(benches)}")
    if extra and len(args.names) > 1:
        parser.error("arguments after -- go to one benchmark: name only one")
    for name in args.names:
        path = run_one(name, benches[name], extra, package, ceilings, args.label, args.baseline)
        if path is not None:
            print(f"[benchmarks] {name}: record appended to {path.relative_to(package)}")
    return 0
