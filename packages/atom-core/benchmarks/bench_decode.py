"""Decode on the seeds' target models (issue 52's table): B=1 tok/s and its share of the active-weight
roofline, and the B=64 step against its floor, through LLM.generate with dummy weights at the published
shapes.

  python -m benchmarks run decode [-- --models llama3-8b deepseek-v2-lite ...]

The issue's method: 512-token prompts (fresh ones, no prefix hits), greedy, every token generated;
t(n) is LLM.generate's wall time for n new tokens (median of --repeats), and a decode step is
(t(128) - t(1)) / 127. Its floor is the bytes the step must read (harness/floors.py: the weights the
batch touches, experts as uniform routing reaches them, KV or latent rows at the mean context, GDN states
read and written) over the copy bandwidth measured in the same run; at B=1 the weights alone over it give
the active-weight roofline. MoE routers are re-drawn (dummy ones send every token to the same experts).
Models that do not fit one GPU in bf16 run fewer layers, said in the name (qwen3-next-80b-a3b-24l,
deepseek-v3-4l: the V3 layer shape, four layers, one dense).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import statistics
import time

import torch

from atom_core.engine import LLM, SamplingParams
from benchmarks.harness.ceilings import copy_bandwidth
from benchmarks.harness.engine_timing import dummy_llm
from benchmarks.harness.floors import cache_bytes, weight_bytes
from benchmarks.harness.shapes import (
    FP8_FORMAT,
    gpt_oss,
    llama3_8b,
    make_config,
    qwen3_30b_a3b,
    v2_lite_shape,
    v3_slice,
)

PROMPT, NEW, BATCHES = 512, 128, (1, 64)


def _fp8(config):
    config.quantization_config = dict(FP8_FORMAT)
    return config


MODELS = {
    "llama3-8b": lambda: llama3_8b(32),
    "llama3-8b-fp8": lambda: _fp8(llama3_8b(32)),
    "qwen3-30b-a3b": qwen3_30b_a3b,
    "deepseek-v2-lite": lambda: v2_lite_shape(27),
    "qwen3.5-35b-a3b": lambda: make_config("qwen3.5-35b-a3b", None),
    "qwen3-next-80b-a3b-24l": lambda: make_config("qwen3-next-80b-a3b", 24),
    "deepseek-v3-4l": v3_slice,
    "gpt-oss-20b": lambda: gpt_oss(24, 32),  # MXFP4 experts: the roofline counts their bytes
    "gpt-oss-120b": lambda: gpt_oss(36, 128),
}


def generate_s(llm: LLM, vocab: int, batch: int, new: int, repeats: int) -> float:
    """Median wall time of LLM.generate for batch fresh prompts and `new` tokens each."""
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    times = []
    for _ in range(repeats):
        prompts = [{"prompt_token_ids": torch.randint(0, vocab, (PROMPT,)).tolist()} for _ in range(batch)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, repeats: int, bandwidth: float, memory_share: float = 0.9) -> list[dict]:
    """memory_share: the engine's gpu_memory_utilization (a model that fills the GPU needs more for B=64)."""
    config = MODELS[name]()
    engine = dict(
        max_model_len=PROMPT + NEW + 16,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=memory_share,
    )
    rows = []
    with dummy_llm(config, **engine) as llm:
        model = llm.engine.runner.model
        for batch in BATCHES:
            generate_s(llm, config.vocab_size, batch, 2, 1)  # compiles this batch's shapes
            first = generate_s(llm, config.vocab_size, batch, 1, repeats)
            whole = generate_s(llm, config.vocab_size, batch, NEW, repeats)
            step = (whole - first) / (NEW - 1)
            if step <= 0:  # t(1 new) above t(128 new): something else ran in the short calls; not a step
                print(f"{name} B={batch}: t(1) {first:.3f} s > t({NEW}) {whole:.3f} s, step not measured")
                step = float("nan")
            weights = weight_bytes(model, batch)
            cache = cache_bytes(model, batch, PROMPT + NEW // 2, torch.bfloat16)
            floor = (weights + cache) / bandwidth
            below = step < 0.98 * floor  # faster than its bytes allow: the floor's routing assumption failed
            if below:
                print(
                    f"{name} B={batch}: step {step * 1e3:.2f} ms below its floor {floor * 1e3:.2f} ms, voided"
                )
            row = dict(
                model=name,
                batch=batch,
                layers=config.num_hidden_layers,
                step_ms=step * 1e3,
                tok_s=batch / step,
                weight_GB=weights / 1e9,
                cache_GB=cache / 1e9,
                floor_ms=floor * 1e3,
                step_over_floor=step / floor,
            )
            if batch == 1:
                row["pct_active_roofline"] = 100 * weights / bandwidth / step
            if below:  # kept as timed, out of the figures the targets read
                row.update(step_ms_as_timed=row.pop("step_ms"), not_measured="timed below its floor")
                row.update(step_over_floor=float("nan"), tok_s=float("nan"))
                row.pop("pct_active_roofline", None)
            rows.append(row)
            print(row, flush=True)
    return rows


GPT_OSS = ("gpt-oss-20b", "gpt-oss-120b")  # issue 54's rows: their own benchmark, bench_decode_gpt_oss


def main(models: tuple[str, ...] | None = None) -> dict:
    """models: the default list (issue 52's models unless given)."""
    parser = argparse.ArgumentParser()
    default = list(models or [m for m in MODELS if m not in GPT_OSS])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=default)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="the engine's share of GPU memory (Qwen3.5-35B-A3B's B=64 cache needs ~0.97 on an 80 GB GPU)",
    )
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    record = dict(
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(),
        copy_TBps=bandwidth / 1e12,
        gpu_memory_utilization=args.gpu_memory_utilization,
        method="step = (t(128 new) - t(1 new)) / 127 through LLM.generate, 512-token prompts",
        rows=[],
    )
    for name in args.models:
        try:
            record["rows"] += measure(name, args.repeats, bandwidth, args.gpu_memory_utilization)
        except (RuntimeError, torch.OutOfMemoryError) as exc:  # too big for this GPU: the others still run
            if "does not fit" not in str(exc) and not isinstance(exc, torch.OutOfMemoryError):
                raise
            record.setdefault("not_measured", []).append(dict(model=name, why=str(exc).splitlines()[0]))
            print(f"{name}: not measured here: {str(exc).splitlines()[0]}", flush=True)
            gc.collect()
            torch.cuda.empty_cache()
    print(f"\n{record['device']}, copy {bandwidth / 1e12:.2f} TB/s")
    print(
        f"{'model':<24} {'B':>3} {'tok/s':>9} {'step ms':>8} {'floor ms':>9} {'step/floor':>10} {'% roofline':>10}"
    )
    for r in record["rows"]:
        if "not_measured" in r:  # voided or not fitting: the reason instead of figures
            print(f"{r['model']:<24} {r['batch']:>3} not measured: {r['not_measured']}")
            continue
        pct = f"{r['pct_active_roofline']:.0f}%" if r["batch"] == 1 else ""
        print(
            f"{r['model']:<24} {r['batch']:>3} {r['tok_s']:>9.1f} {r['step_ms']:>8.3f} {r['floor_ms']:>9.3f} "
            f"{r['step_over_floor']:>10.2f} {pct:>10}"
        )
    return record


if __name__ == "__main__":
    main()
