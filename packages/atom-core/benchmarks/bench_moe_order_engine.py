"""Qwen3-30B-A3B decode in the native engine with the one-program expert ordering on and off (H200).

  python -m benchmarks run moe_order_engine

The same config is built twice, bf16 dummy weights with realistic routers: once with atom-kernels'
SMALL_ORDER_PAIRS at its value (decode orders its pairs in one launch a layer) and once at 0 (a memset
and three launches a layer, as before). For B = 1, 8 and 64 sequences of 512 prompt tokens: the engine's
whole step and the decode forward alone (CUDA-graph replay). A table is printed last.
"""

from __future__ import annotations

import argparse
import datetime

import torch

import atom_kernels.moe.align as align
from benchmarks.harness.engine_timing import engine_step_times
from benchmarks.harness.shapes import qwen3_30b_a3b

BATCHES = (1, 8, 64)  # 8, 64 and 512 (token, expert) pairs a layer: the last takes the multi-launch path


def measure(small_order_pairs: int) -> dict[int, tuple[float, float]]:
    """{batch: (whole step ms, forward ms)} with the one-program ordering up to that many pairs."""
    kept = align.SMALL_ORDER_PAIRS
    align.SMALL_ORDER_PAIRS = small_order_pairs  # read at each call; graphs are captured at startup
    try:
        return engine_step_times(qwen3_30b_a3b(), BATCHES, steps=24)
    finally:
        align.SMALL_ORDER_PAIRS = kept


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    one, multi = measure(align.SMALL_ORDER_PAIRS), measure(0)
    rows = []
    for batch in BATCHES:
        (one_step, one_fwd), (multi_step, multi_fwd) = one[batch], multi[batch]
        rows.append(
            dict(
                batch=batch,
                one_program_step_ms=one_step,
                multi_launch_step_ms=multi_step,
                one_program_forward_ms=one_fwd,
                multi_launch_forward_ms=multi_fwd,
                one_program_tok_s=batch * 1e3 / one_step,
                multi_launch_tok_s=batch * 1e3 / multi_step,
            )
        )
        print(rows[-1], flush=True)
    record = dict(
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(),
        model="Qwen3-30B-A3B shape, bf16 dummy weights, realistic routers",
        small_order_pairs=align.SMALL_ORDER_PAIRS,
        rows=rows,
    )
    print(f"\n{record['device']}  {record['model']}; decode after 512-token prompts")
    print(
        f"{'B':>3} {'step ms one':>12} {'multi':>8} {'fwd ms one':>11} {'multi':>8} {'tok/s one':>10} {'multi':>8}"
    )
    for r in rows:
        print(
            f"{r['batch']:>3} {r['one_program_step_ms']:>12.3f} {r['multi_launch_step_ms']:>8.3f} "
            f"{r['one_program_forward_ms']:>11.3f} {r['multi_launch_forward_ms']:>8.3f} "
            f"{r['one_program_tok_s']:>10.1f} {r['multi_launch_tok_s']:>8.1f}"
        )
    return record


if __name__ == "__main__":
    main()
