"""Requests arriving over time through the engine (atom bench's run_bench): throughput, latency and the
share of steps that overlap the host, with MTP verifies launched ahead and the requests that arrive
admitted beside them (plan.prefills_ahead) against the same engine settling the verify in flight at
each admission instead, in the same run.

  python -m benchmarks run arrivals

DeepSeek-V2-Lite with MTP k=2 at its published shape, dummy bf16 weights with the routers redrawn to
realistic spreads (dummy ones send every token to the same few experts, so a run's speed would follow
whichever tokens it happened to produce). Before measuring, a short run of each sampling and each mode
compiles every kernel the arrival paths launch. Each sampling (greedy; temperature 0.8 / top-p 0.95 /
a seed per request) then runs --repeats times per mode, the modes alternating which goes first; every
run draws its own prompts (the same ones would hit the prefix cache the run before filled).

sync_sites: where the host waited for the device (torch.cuda.set_sync_debug_mode) during one short run
of each mode, by the atom frames that called it. A verify launched ahead is read through an event
(host_copy.PendingRead), which this does not count.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import tempfile
import traceback
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from atom_core.engine import LLM, SamplingParams
from atom_core.entrypoints.bench import run_bench
from benchmarks.harness.routers import redraw_llm_routers
from benchmarks.harness.shapes import configs

SAMPLINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "t0.8/p0.95/seed": SamplingParams(temperature=0.8, top_p=0.95, seed=1),
}


def set_prefills_ahead(llm: LLM, on: bool) -> None:
    """Admit arriving requests beside the verify in flight (on) or settle it first (off)."""
    overlap = llm.engine.pipeline.overlap
    if on and not llm.engine.plan.prefills_ahead:
        raise SystemExit(f"the plan keeps prefills ahead off: {dict(llm.engine.plan.off)}")
    overlap.prefills = on


def sync_sites(run) -> dict[str, int]:
    """{the innermost atom frames of a call that synchronized: how often} while run() runs."""
    sites = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "/atom_" in f.filename]
        sites[" < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[::-1][:4])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return dict(sites)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="deepseek-v2-lite-mtp2")
    parser.add_argument("--rates", default="24", help="requests a second, comma-separated")
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--label", default="", help="which tree ran (kept in the record)")
    args = parser.parse_args()
    config, extra = configs(args.model)
    record = dict(
        device=torch.cuda.get_device_name(),
        model=f"{args.model}, dummy bf16 weights, routers redrawn",
        label=args.label,
        requests=f"{args.num_prompts} x ({args.input_len} in, {args.output_len} out), max_num_seqs 64",
        runs=[],
        sync_sites={},
    )
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        llm = LLM(d, load_format="dummy", dtype="bfloat16", max_model_len=1024, max_num_seqs=64, **extra)
        redraw_llm_routers(llm, config.hidden_size)
        engine, rates = llm.engine, [float(r) for r in args.rates.split(",")]
        full = dict(num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len)
        seeds = itertools.count(1)  # every run its own prompts: none hits the prefix cache of a run before
        for name, params in SAMPLINGS.items():  # warm-up: every kernel and shape of both modes compiled
            for on in (True, False):
                print(f"warm-up: {name}, prefills ahead {on}", flush=True)
                set_prefills_ahead(llm, on)
                run_bench(engine, **full, seed=next(seeds), request_rate=rates[0], params=params)
        seeded = SAMPLINGS["t0.8/p0.95/seed"]
        short = dict(num_prompts=24, input_len=args.input_len, output_len=16, request_rate=rates[0])
        for on in (True, False):
            set_prefills_ahead(llm, on)
            sites = sync_sites(lambda: run_bench(engine, **short, seed=next(seeds), params=seeded))
            record["sync_sites"]["prefills ahead" if on else "settle"] = sites
        for rate in rates:
            for name, params in SAMPLINGS.items():
                for repeat in range(args.repeats):
                    # the modes alternate which runs first (a later run meets a warmer machine)
                    for on in (True, False) if repeat % 2 == 0 else (False, True):
                        set_prefills_ahead(llm, on)
                        result = run_bench(
                            engine, **full, seed=next(seeds), request_rate=rate, params=replace(params)
                        )
                        row = dict(
                            mode="prefills ahead" if on else "settle",
                            sampling=name,
                            repeat=repeat,
                            **result.as_dict(),
                        )
                        record["runs"].append(row)
                        print(
                            f"rate {rate:g} {name:>16} {row['mode']:>15} #{repeat}: "
                            f"{result.output_tok_s:7.1f} tok/s, overlap {result.overlapped_steps}/"
                            f"{result.steps}, ttft p50 {result.ttft_ms_p50:.0f} ms",
                            flush=True,
                        )
    print(json.dumps(record["sync_sites"], indent=1))
    return record


if __name__ == "__main__":
    main()
