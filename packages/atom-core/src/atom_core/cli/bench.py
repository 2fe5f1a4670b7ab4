"""`atom bench`: the engine's offline throughput and latency on random prompts, all at once or arriving
as a Poisson process."""

from __future__ import annotations

import argparse
import json
import math

from atom_core.cli.common import Help, configure_logging, say, with_engine_args


def add_parser(sub) -> None:
    bench = with_engine_args(
        sub.add_parser(
            "bench",
            help="offline throughput and latency (default: the built-in demo model)",
            formatter_class=Help,
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
    bench.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="each request's input and output lengths are drawn from [len x (1 - r), len x (1 + r)] "
        "(vLLM's random dataset); 0: all equal",
    )
    bench.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    bench.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the top tokens' mass kept")
    bench.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace) -> int:
    from atom_core.demo import ensure_demo_checkpoint
    from atom_core.engine import EngineConfig, LLMEngine, SamplingParams
    from atom_core.entrypoints.bench import run_bench

    configure_logging(args.log_level)

    if min(args.num_prompts, args.input_len, args.output_len) < 1:
        say("error: --num-prompts, --input-len and --output-len must be at least 1")
        return 2
    if not args.request_rate > 0:
        say(f"error: --request-rate must be positive, got {args.request_rate}")
        return 2
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p)  # (seeded by --seed)
    except ValueError as err:
        say(f"error: {err}")
        return 2
    model_dir = args.model or ensure_demo_checkpoint(log=say)
    if not 0 <= args.random_range_ratio < 1:
        say(f"error: --random-range-ratio must be in [0, 1), got {args.random_range_ratio}")
        return 2
    longest = math.ceil((args.input_len + args.output_len) * (1 + args.random_range_ratio))
    max_model_len = args.max_model_len or longest + 8
    engine = LLMEngine(EngineConfig.from_cli_args(args, model=model_dir, max_model_len=max_model_len))
    try:
        result = run_bench(
            engine,
            num_prompts=args.num_prompts,
            input_len=args.input_len,
            output_len=args.output_len,
            request_rate=args.request_rate,
            range_ratio=args.random_range_ratio,
            params=params,
        )
    finally:
        engine.shutdown()
    print(json.dumps(result.as_dict()) if args.json else result.table())
    return 0
