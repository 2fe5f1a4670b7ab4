"""Time to first token through the public LLM.generate, at published shapes with dummy bf16 weights.

  python -m benchmarks run ttft [-- --models qwen3.5-35b-a3b deepseek-v2-lite llama3-8b --lengths 16 512]
  ... -- --eager-prefill   (prefill steps not replayed from CUDA graphs: max_prefill_graph_tokens=0)

One request at a time, max_tokens=1, prefix caching on (as served) and fresh random prompt tokens every
run (no prefix hit); the median of --repeats runs after a warm-up of each length. MoE routers re-drawn, so
the experts a prompt touches spread as trained routers spread them.

Beside each time, what explains it: the forwards the prefill took, and from one profiled run the GPU
kernels it launched and their summed GPU time. A prefill whose wall time is far above its GPU time is
host-bound: the launches, not the math, set its speed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from atom_core.engine import LLM, SamplingParams
from benchmarks.harness.engine_timing import dummy_llm
from benchmarks.harness.shapes import llama3_8b, make_config, v2_lite_shape

MODELS = {
    "llama3-8b": lambda: llama3_8b(32),
    "deepseek-v2-lite": lambda: v2_lite_shape(27),
    "qwen3.5-35b-a3b": lambda: make_config("qwen3.5-35b-a3b", None),
}
FIRST = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


class ForwardCount:
    """Counts the target model's forwards (ModelRunner.run calls) while installed."""

    def __init__(self, runner):
        self.runner, self.run, self.count = runner, runner.run, 0

    def __enter__(self):
        def counted(*args, **kwargs):
            self.count += 1
            return self.run(*args, **kwargs)

        self.runner.run = counted
        return self

    def __exit__(self, *exc):
        self.runner.run = self.run


def first_token_ms(llm: LLM, vocab: int, length: int) -> float:
    prompt = {"prompt_token_ids": torch.randint(0, vocab, (length,)).tolist()}
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate([prompt], FIRST, use_tqdm=False)
    # the token is the host's once generate returns; a step launched ahead of reading it (async
    # scheduling) may still run, and is waited for only before the next measurement
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e3


def gpu_profile(llm: LLM, vocab: int, length: int) -> tuple[int, float]:
    """(GPU kernels launched, their summed GPU ms) of one first token."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        first_token_ms(llm, vocab, length)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels), sum(e.device_time for e in kernels) / 1e3


def measure(name: str, lengths: list[int], repeats: int, engine: dict) -> list[dict]:
    config = MODELS[name]()
    rows = []
    longest = max(lengths)
    sizes = dict(max_model_len=longest + 16, max_num_seqs=4, max_num_batched_tokens=max(8192, longest))
    with dummy_llm(config, **sizes, **engine) as llm:
        for length in lengths:
            for _ in range(2):  # warm-up: compile and autotune at this length
                first_token_ms(llm, config.vocab_size, length)
            with ForwardCount(llm.engine.runner) as forwards:
                times = [first_token_ms(llm, config.vocab_size, length) for _ in range(repeats)]
            kernels, gpu_ms = gpu_profile(llm, config.vocab_size, length)
            ttft = statistics.median(times)
            rows.append(
                dict(
                    model=name,
                    tokens=length,
                    ttft_ms=ttft,
                    min_ms=min(times),
                    forwards=forwards.count / repeats,
                    kernels=kernels,
                    gpu_ms=gpu_ms,
                    host_bound=ttft / gpu_ms,
                )
            )
            r = rows[-1]
            print(
                f"{name:18} {length:5} tokens  TTFT {ttft:7.1f} ms (min {r['min_ms']:.1f})  "
                f"{r['forwards']:.0f} forward(s)  {kernels} kernels, {gpu_ms:.1f} ms GPU: wall/GPU "
                f"{r['host_bound']:.1f}x",
                flush=True,
            )
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[16, 512, 2048])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--eager-prefill", action="store_true", help="max_prefill_graph_tokens=0")
    args = parser.parse_args()
    engine = dict(max_prefill_graph_tokens=0) if args.eager_prefill else {}
    rows = []
    for name in args.models:
        rows += measure(name, args.lengths, args.repeats, engine)
    return dict(
        device=torch.cuda.get_device_name(), repeats=args.repeats, eager_prefill=args.eager_prefill, rows=rows
    )


if __name__ == "__main__":
    main()
