"""FP8 block-quantized weights against bf16 in the native engine on a GPU (dummy weights for both).

  python -m benchmarks run fp8_engine -- [--models llama3-8b qwen3-30b-a3b dsv3-slice]

Each model is built twice from one config: bf16, and with the checkpoint format DeepSeek-V3 ships
(`quant_method: fp8`, e4m3, dynamic activations, 128x128 weight blocks), load_format="dummy" filling e4m3
weights and their scales. For B = 1 and B = 64 sequences of 512 prompt tokens, decoding: the engine's
whole step (host work included) and the decode forward alone (CUDA-graph replay), as decode tok/s, and
fp8's speed-up over bf16 in the same run. Routers are re-drawn in the MoE models (dummy ones send every
token to the same experts). The DeepSeek-V3 slice is bench_deepseek_v3_slice.py's four layers.
"""

from __future__ import annotations

import argparse
import datetime

import torch
from transformers import PretrainedConfig

from benchmarks.harness.ceilings import copy_bandwidth
from benchmarks.harness.engine_timing import engine_step_times
from benchmarks.harness.shapes import FP8_FORMAT, llama3_8b, qwen3_30b_a3b, v3_slice

BATCHES = (1, 64)


MODELS = {
    "llama3-8b": lambda: llama3_8b(32),
    "qwen3-30b-a3b": qwen3_30b_a3b,
    "dsv3-slice": v3_slice,
}


def measure(config: PretrainedConfig, fp8: bool) -> dict[int, tuple[float, float]]:
    """{batch: (whole step ms, forward ms)} for one build of config."""
    if fp8:
        config.quantization_config = dict(FP8_FORMAT)
    elif hasattr(config, "quantization_config"):
        del config.quantization_config
    return engine_step_times(config, BATCHES, steps=16)


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    record = dict(
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(),
        copy_TBps=copy_bandwidth() / 1e12,
        fp8_format=FP8_FORMAT,
        rows=[],
    )
    for name in args.models:
        runs = {fp8: measure(MODELS[name](), fp8) for fp8 in (False, True)}
        for batch in BATCHES:
            (bf_step, bf_fwd), (f8_step, f8_fwd) = runs[False][batch], runs[True][batch]
            row = dict(
                model=name,
                batch=batch,
                bf16_step_ms=bf_step,
                fp8_step_ms=f8_step,
                bf16_forward_ms=bf_fwd,
                fp8_forward_ms=f8_fwd,
                bf16_tok_s=batch * 1e3 / bf_step,
                fp8_tok_s=batch * 1e3 / f8_step,
                step_speedup=bf_step / f8_step,
                forward_speedup=bf_fwd / f8_fwd,
            )
            record["rows"].append(row)
            print(row, flush=True)
    print(f"\n{record['device']}  copy {record['copy_TBps']:.2f} TB/s; decode with 512-token prompts")
    print(
        f"{'model':<15} {'B':>3} {'bf16 tok/s':>11} {'fp8 tok/s':>10} {'x step':>7} "
        f"{'bf16 fwd ms':>12} {'fp8 fwd ms':>11} {'x fwd':>6}"
    )
    for r in record["rows"]:
        print(
            f"{r['model']:<15} {r['batch']:>3} {r['bf16_tok_s']:>11.1f} {r['fp8_tok_s']:>10.1f} "
            f"{r['step_speedup']:>7.2f} {r['bf16_forward_ms']:>12.3f} {r['fp8_forward_ms']:>11.3f} "
            f"{r['forward_speedup']:>6.2f}"
        )
    print("targets: B=1 >= 1.7x, B=64 >= 1.4x (fp8 over bf16)")
    return record


if __name__ == "__main__":
    main()
