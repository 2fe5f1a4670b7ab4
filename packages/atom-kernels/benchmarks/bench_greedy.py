"""Greedy sampling's last step: atom-kernels' greedy_tokens (one launch) against torch's argmax, isfinite
.all() and stack (what the engine ran before), on a decode step's logits.

  python -m benchmarks run greedy

Two timings per case: the device time of calls replayed from a CUDA graph (graph_timing.py: inputs
rotated so each call reads its logits from DRAM) and the wall time of eager calls back to back, which is
how the engine runs them (after the step's graph replay) and includes their launches. GB/s: the logits'
bytes over the device time; % of copy: that against the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import time

import torch

from atom_kernels.sampling import greedy_tokens, greedy_tokens_ref
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms, rotation

CASES = [(1, 128256), (1, 151936), (64, 128256), (256, 151936)]  # rows, vocabulary (Llama-3, Qwen3)


def _eager_us(fn, logits, calls: int = 200) -> float:
    fn(logits)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(logits)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    copy_bw, _ = measure_ceilings()
    rows_out = []
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    print(
        f"{'rows x vocab':>14} {'kernel us':>10} {'GB/s':>7} {'% copy':>7} {'torch us':>9} {'x':>6} {'eager kernel':>13} {'eager torch':>12}"
    )
    for rows, vocab in CASES:
        copies = [
            torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16) * 3
            for _ in range(rotation(rows * vocab * 2))
        ]
        for logits in copies:
            assert torch.equal(greedy_tokens(logits), greedy_tokens_ref(logits))
        kernel = graph_ms([lambda x=x: greedy_tokens(x) for x in copies]) * 1e3
        ref = graph_ms([lambda x=x: greedy_tokens_ref(x) for x in copies]) * 1e3
        eager_kernel, eager_ref = _eager_us(greedy_tokens, copies[0]), _eager_us(greedy_tokens_ref, copies[0])
        gbs = rows * vocab * 2 / (kernel * 1e-6) / 1e9
        pct = gbs * 1e9 / copy_bw * 100
        print(
            f"{rows:>5} x {vocab:<6} {kernel:>10.2f} {gbs:>7.0f} {pct:>6.0f}% {ref:>9.2f} {ref / kernel:>5.1f}x"
            f" {eager_kernel:>11.1f}us {eager_ref:>10.1f}us"
        )
        rows_out.append(
            dict(
                rows=rows,
                vocab=vocab,
                kernel_us=kernel,
                torch_us=ref,
                kernel_gbs=gbs,
                pct_of_copy=pct,
                eager_kernel_us=eager_kernel,
                eager_torch_us=eager_ref,
            )
        )
    return dict(device=torch.cuda.get_device_name(), copy_bw_gbs=copy_bw / 1e9, cases=rows_out)


if __name__ == "__main__":
    main()
