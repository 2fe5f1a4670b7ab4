"""Where an MTP speculative step's time goes: DeepSeek-V2-Lite shape with its MTP layer, acceptance forced.

  python -m benchmarks run profile_spec_step -- [--ks 1 3] [--batches 1,64] [--layers 27]

Issue 52 asks a B=1 k=3 speculative step for 2.8x plain decoding's speed at full acceptance; the verify
forward alone is about 1.2x a plain step, so the rest of the step (the draft's catch-up and chained
forwards, the host's work between them) decides. For each k and batch, after 512-token prompts and with
every draft accepted (bench_deepseek.force_full_acceptance), it reports the engine step's wall time with
async scheduling and without, and over ten async steps under torch.profiler: the GPU's busy time (the
union of kernel intervals; a PDL kernel counts from when it is placed, so waits inside the chain count as
busy) against the wall time, which says whether the step is host- or device-bound, and the kernels by
time (ms and calls per step).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from atom_core.engine import LLM, SamplingParams
from benchmarks.bench_deepseek import force_full_acceptance
from benchmarks.harness.engine_timing import PROMPT, prompts
from benchmarks.harness.routers import redraw_llm_routers
from benchmarks.harness.shapes import v2_lite_shape
from benchmarks.profile_engine_step import print_kernel_table

PROFILED_STEPS = 10


def busy_ms(prof: torch.profiler.profile) -> float:
    """The union of the profiled CUDA kernels' intervals, in ms (time some kernel was resident)."""
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1000


def _steps_ms(llm: LLM, steps: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        llm.engine.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def profile(llm: LLM, vocab: int, batch: int) -> dict:
    """One batch's row: async and sync step ms, busy / wall over profiled async steps, the kernel table."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=4096 - PROMPT, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts(vocab, batch)]
    while any(s.num_computed_tokens < PROMPT for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(4):
        engine.step()
    overlap = engine.pipeline.overlap
    async_ms = _steps_ms(llm, 20)
    overlap.enabled = False  # settles the step in flight
    sync_ms = _steps_ms(llm, 20)
    overlap.enabled = True
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(PROFILED_STEPS):
            engine.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / PROFILED_STEPS * 1e3
    busy = busy_ms(prof) / PROFILED_STEPS
    kernels = print_kernel_table(prof, batch, per=PROFILED_STEPS)
    for request_id in ids:
        engine.abort(request_id)
    return dict(
        batch=batch,
        async_step_ms=async_ms,
        sync_step_ms=sync_ms,
        profiled_step_ms=wall,
        gpu_busy_ms=busy,
        busy_over_wall=busy / wall,
        kernels=kernels,
    )


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3], help="MTP draft lengths")
    parser.add_argument("--batches", default="1,64", help="batch sizes, comma-separated (at most 64)")
    parser.add_argument("--layers", type=int, default=27)
    args = parser.parse_args()
    config = v2_lite_shape(args.layers)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as path:
        config.save_pretrained(path)
        for k in args.ks:
            spec = {"method": "mtp", "num_speculative_tokens": k}
            llm = LLM(
                path,
                load_format="dummy",
                dtype="bfloat16",
                max_model_len=4096,
                max_num_seqs=64,
                num_kv_blocks=4096,  # 16-token blocks: 64 sequences of ~750 tokens and their drafts
                speculative_config=spec,
            )
            redraw_llm_routers(llm, config.hidden_size)
            force_full_acceptance(llm)
            for batch in batches:
                rows.append(dict(k=k, **profile(llm, config.vocab_size, batch)))
            llm.engine.shutdown()
            del llm
            torch.cuda.empty_cache()
    print(
        f"\n{torch.cuda.get_device_name()}  DeepSeek-V2-Lite shape ({args.layers} layers) + MTP, acceptance forced"
    )
    print(
        f"{'k':>2} {'B':>3} {'async ms':>9} {'sync ms':>8} {'profiled':>9} {'GPU busy':>9} {'busy/wall':>9}"
    )
    for r in rows:
        print(
            f"{r['k']:>2} {r['batch']:>3} {r['async_step_ms']:>9.2f} {r['sync_step_ms']:>8.2f} "
            f"{r['profiled_step_ms']:>9.2f} {r['gpu_busy_ms']:>9.2f} {r['busy_over_wall']:>9.2f}"
        )
    return dict(device=torch.cuda.get_device_name(), layers=args.layers, rows=rows)


if __name__ == "__main__":
    main()
