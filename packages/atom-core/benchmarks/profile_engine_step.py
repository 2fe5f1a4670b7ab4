"""Where a decode step's time goes: the CUDA-graph replay on the GPU vs the engine's whole step.

  python -m benchmarks run profile_engine_step

Llama-3-8B shape (or --model qwen3-30b-a3b from bench_fp8_engine.py, deepseek-v2-lite from bench_decode.py,
qwen3.5-35b-a3b / qwen3-next-80b-a3b from bench_qwen3_next.py, and bench_decode.py's other rows:
llama3-8b-fp8, gpt-oss-20b / gpt-oss-120b with MXFP4 experts, the V3 slice; MoE routers re-drawn), dummy
weights.
For B=1 and B=64 sequences (--batches) at ~600 tokens of context it reports the GPU time of one graph
replay (CUDA events over back-to-back replays), the wall time of one decode step of the engine with async
scheduling (the default: the host's work overlaps the GPU's) and without, and the host's share of a
synchronous step split into schedule / inputs / forward / sample.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.execution.step_inputs import prepare_step
from atom_core.engine.sampling.sampler import sample
from benchmarks.bench_decode import MODELS as DECODE_ROWS
from benchmarks.harness.routers import redraw_routers
from benchmarks.harness.shapes import SHAPES, llama3_8b, make_config, qwen3_30b_a3b, v2_lite_shape


def print_kernel_table(prof, batch: int, per: int) -> dict:
    """The profiled kernels per step (or replay): total, launches, and the top 30 by time (printed and
    returned for the record: where a step's time goes is what explains a miss)."""
    events = prof.key_averages()
    total = sum(e.device_time_total for e in events) / per / 1000
    launches = sum(e.count for e in events) // per
    print(
        f"\nB={batch}: {total:.2f} ms of kernels in {launches} launches per step; "
        "top kernels (ms per step, calls per step):"
    )
    top = []
    for e in sorted(events, key=lambda e: -e.device_time_total)[:30]:
        ms, calls = e.device_time_total / per / 1000, e.count // per
        print(f"  {ms:7.3f} {calls:5d}  {e.key[:90]}")
        top.append(dict(kernel=e.key[:120], ms=ms, calls=calls))
    return dict(batch=batch, kernel_ms=total, launches=launches, top=top)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model",
        choices=sorted({"llama3-8b", "qwen3-30b-a3b", "deepseek-v2-lite", *SHAPES, *DECODE_ROWS}),
        default="llama3-8b",
    )
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument(
        "--kernels", action="store_true", help="also list each replay's kernels (torch.profiler)"
    )
    parser.add_argument("--batches", default="1,64", help="batch sizes, comma-separated (at most 64)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--disable-custom-all-reduce", action="store_true", help="TP: NCCL all-reduces")
    args = parser.parse_args()
    tp = args.tensor_parallel_size
    batches = [int(b) for b in args.batches.split(",")]
    hybrid = args.model in SHAPES
    if hybrid:
        config = make_config(args.model, args.layers)
    elif args.model == "qwen3-30b-a3b":
        config = qwen3_30b_a3b()
        if args.layers:
            config.num_hidden_layers = args.layers
    elif args.model == "deepseek-v2-lite":
        config = v2_lite_shape(args.layers or 27)
    elif args.model == "llama3-8b":
        config = llama3_8b(args.layers or 32)
    else:  # bench_decode's other rows as it builds them (quantization as published, slices already cut)
        if args.layers:
            parser.error(f"--layers does not apply to {args.model}: bench_decode's row is measured as built")
        config = DECODE_ROWS[args.model]()
    rows, kernels = [], []
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        llm = LLM(
            d,
            load_format="dummy",
            dtype="bfloat16",
            max_model_len=args.max_model_len,
            max_num_seqs=64,
            tensor_parallel_size=tp,
            disable_custom_all_reduce=args.disable_custom_all_reduce,
        )
        engine = llm.engine
        # rank 0's runner (with TP, the other ranks follow its steps; a lone replay there would wait)
        runner = engine.runner.runner if tp > 1 else engine.runner
        if not args.model.startswith("llama3-8b"):  # every other shape has MoE routers
            redraw_routers(runner.model.named_parameters(), config.hidden_size)
        for batch in batches:
            params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
            ids = [
                engine.add_request(
                    {"prompt_token_ids": torch.randint(0, config.vocab_size, (600,)).tolist()}, params
                )
                for _ in range(batch)
            ]
            while any(s.num_uncomputed > 1 for r in engine.requests.values() for s in r.seqs):
                engine.step()  # prefill
            for _ in range(5):
                engine.step()  # decode warm-up
            replay_ms = None
            if tp == 1:
                graphs = engine.runner.graphs.decode
                size = graphs.size_for(batch)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(50):
                    graphs.graphs[size].replay()
                end.record()
                torch.cuda.synchronize()
                replay_ms = start.elapsed_time(end) / 50
            steps = 30
            whole = {}
            for asynchronous in (True, False):
                engine.pipeline.overlap.enabled = asynchronous  # turning it off settles the step in flight
                for _ in range(3):
                    engine.step()
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(steps):
                    engine.step()
                torch.cuda.synchronize()
                whole[asynchronous] = (time.perf_counter() - t) * 1000 / steps
            parts = {"schedule": 0.0, "inputs": 0.0, "forward": 0.0, "sample": 0.0}
            t_all = time.perf_counter()
            for _ in range(steps):
                t0 = time.perf_counter()
                sched = engine.scheduler.schedule()
                t1 = time.perf_counter()
                inputs = prepare_step(sched)
                t2 = time.perf_counter()
                logits = engine.runner.run(inputs).logits
                t3 = time.perf_counter()
                for seq, n in zip(sched.seqs, sched.num_new_tokens, strict=True):
                    seq.num_computed_tokens += n
                    engine.blocks.register_full_blocks(seq)
                tokens = sample(logits, sched.seqs).tokens
                for seq, token in zip(sched.seqs, tokens, strict=True):
                    seq.append(token, None)
                t4 = time.perf_counter()
                for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    parts[k] += v * 1000 / steps
            step_ms = (time.perf_counter() - t_all) * 1000 / steps
            rows.append(
                dict(
                    batch=batch,
                    replay_ms=replay_ms,
                    async_step_ms=whole[True],
                    sync_step_ms=whole[False],
                    step_ms=step_ms,
                    **{f"{k}_ms": v for k, v in parts.items()},
                )
            )
            if args.kernels and tp > 1:  # rank 0's kernels over whole steps (replays need every rank)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        engine.step()
                    torch.cuda.synchronize()
                kernels.append(print_kernel_table(prof, batch, per=10))
            engine.pipeline.overlap.enabled = True
            for r in ids:
                engine.abort(r)
        if args.kernels and tp == 1:  # last: CUPTI left active afterwards slows the host's launches
            graphs = engine.runner.graphs.decode
            for batch in batches:  # replays need only the graph's static buffers
                size = graphs.size_for(batch)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        graphs.graphs[size].replay()
                    torch.cuda.synchronize()
                kernels.append(print_kernel_table(prof, batch, per=10))
        llm.shutdown()
    layers = config.num_hidden_layers
    print(f"\n{torch.cuda.get_device_name()} x TP {tp}  {args.model} shape, {layers} layers, context ~600")
    print(
        f"{'B':>4} {'replay ms':>10} {'async step':>10} {'sync step':>9} {'parts:':>7} {'step ms':>8} "
        f"{'schedule':>9} {'inputs':>7} {'forward':>8} {'sample':>7}"
    )
    for r in rows:
        print(
            f"{r['batch']:>4} {r['replay_ms'] or float('nan'):>10.2f} {r['async_step_ms']:>10.2f} "
            f"{r['sync_step_ms']:>9.2f} {'':>7} {r['step_ms']:>8.2f} {r['schedule_ms']:>9.2f} "
            f"{r['inputs_ms']:>7.2f} {r['forward_ms']:>8.2f} {r['sample_ms']:>7.2f}"
        )
    return dict(
        device=torch.cuda.get_device_name(),
        tensor_parallel_size=tp,
        custom_all_reduce=tp > 1 and not args.disable_custom_all_reduce,
        rows=rows,
        **({"kernels": kernels} if kernels else {}),
    )


if __name__ == "__main__":
    main()
