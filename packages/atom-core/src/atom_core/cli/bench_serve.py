"""`atom bench-serve`: a serving benchmark against a running OpenAI-compatible server (`atom serve`, or
another engine's), in the shape of `vllm bench serve`. It needs no model weights and imports no torch."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from atom_core.cli.common import Help, say


def _percentiles(raw: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in raw.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--metric-percentiles wants numbers like 50,90,99, got {raw!r}"
        ) from None
    if not values or not all(0 < v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"--metric-percentiles are in (0, 100], got {raw!r}")
    return values


def add_parser(sub) -> None:
    bench = sub.add_parser(
        "bench-serve",
        help="serving benchmark against an OpenAI-compatible server: throughput, TTFT, TPOT, ITL, latency",
        description=__doc__,
        formatter_class=Help,
    )
    bench.add_argument(
        "--base-url", default="http://127.0.0.1:8000", help="the server's address, without /v1"
    )
    bench.add_argument("--endpoint", default="/v1/completions", help="the completions route under --base-url")
    bench.add_argument("--model", help="the served model's name (default: the first the server lists)")
    bench.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default: $OPENAI_API_KEY)"
    )
    bench.add_argument("--num-prompts", type=int, default=100, help="requests to send")
    bench.add_argument(
        "--input-len", "--random-input-len", type=int, default=1024, help="prompt tokens a request"
    )
    bench.add_argument(
        "--output-len", "--random-output-len", type=int, default=128, help="tokens to generate a request"
    )
    bench.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="each request's lengths are drawn from [len x (1 - r), len x (1 + r)]; 0: all equal",
    )
    bench.add_argument(
        "--max-token-id",
        type=int,
        required=True,
        help="prompts are random token ids in [0, N): give the model's vocabulary size or less",
    )
    bench.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="requests a second, arriving as a Poisson process (default: all at once)",
    )
    bench.add_argument("--max-concurrency", type=int, help="requests in flight at most (default: no limit)")
    bench.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ask the server to generate --output-len tokens past any end of sequence (vLLM's extension)",
    )
    bench.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    bench.add_argument("--seed", type=int, default=0, help="seeds the prompts, lengths and arrival times")
    bench.add_argument(
        "--metric-percentiles",
        type=_percentiles,
        default=(90.0, 99.0),
        help="percentiles to report, beside the mean and median",
    )
    bench.add_argument("--timeout", type=float, default=600.0, help="seconds a request may stay silent")
    bench.add_argument("--json", action="store_true", help="print the result as one JSON object")
    bench.add_argument("--save-result", type=Path, help="also write the result's JSON to this file")


def run(args: argparse.Namespace) -> int:
    from atom_core.entrypoints.serving_bench import ServeBenchSpec, run_serve_bench

    spec = ServeBenchSpec(
        base_url=args.base_url.rstrip("/"),
        max_token_id=args.max_token_id,
        model=args.model,
        endpoint="/" + args.endpoint.lstrip("/"),
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.random_range_ratio,
        request_rate=args.request_rate,
        max_concurrency=args.max_concurrency,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        seed=args.seed,
        api_key=args.api_key,
        percentiles=args.metric_percentiles,
        timeout_s=args.timeout,
    )
    result = run_serve_bench(spec)
    text = json.dumps(result.as_dict())
    if args.save_result is not None:
        args.save_result.write_text(text + "\n")
    print(text if args.json else result.table())
    if result.failed:
        say(f"error: {result.failed} of {result.num_prompts} requests failed")
        return 1
    return 0
