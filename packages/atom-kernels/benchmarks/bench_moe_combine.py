"""The MoE combine (each token's k weighted expert rows summed) against torch's sum over the [T, k, H] view,
which fused_experts ran before, on the H200.

  python -m benchmarks run moe_combine

Qwen3-30B-A3B (H = 2048) and DeepSeek-V3 (H = 7168), k = 8, bf16, T = 1..4096 tokens; both timed as
CUDA-graph replays (graph_timing) over input copies that miss the L2, as in a decode step. % copy: the
bytes read and written over the copy bandwidth measured in the same run. Results equal to fp32 sums.
"""

from __future__ import annotations

import argparse

import torch

from atom_kernels.moe.combine import combine_topk
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms, rotation

SHAPES = {"qwen3-30b-a3b": 2048, "dsv3": 7168}
TOKENS = (1, 8, 64, 512, 4096)
TOP_K = 8


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    copy_bw, _ = measure_ceilings()
    rows = []
    for name, hidden in SHAPES.items():
        for tokens in TOKENS:
            nbytes = (tokens * TOP_K + tokens) * hidden * 2
            ys = [
                torch.randn(tokens * TOP_K, hidden, device="cuda", dtype=torch.bfloat16)
                for _ in range(rotation(nbytes))
            ]
            out = torch.empty(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            want = ys[0].view(tokens, TOP_K, hidden).float().sum(1)
            err = (combine_topk(ys[0], TOP_K, out).float() - want).abs().max().item()
            assert err <= 2**-7 * want.abs().max().item(), f"{name} T={tokens}: off by {err}"
            ours = graph_ms([lambda y=y, out=out: combine_topk(y, TOP_K, out) for y in ys])
            base = graph_ms(
                [
                    lambda y=y, out=out: torch.sum(y.view(*out.shape[:1], TOP_K, -1), dim=1, out=out)
                    for y in ys
                ]
            )
            rows.append(
                dict(
                    shape=name,
                    hidden=hidden,
                    tokens=tokens,
                    combine_us=ours * 1e3,
                    torch_sum_us=base * 1e3,
                    speedup=base / ours,
                    pct_copy=100 * nbytes / (ours * 1e-3) / copy_bw,
                )
            )
            print(rows[-1], flush=True)
            del ys
    print(f"\ncopy {copy_bw / 1e12:.2f} TB/s; k = {TOP_K}, bf16")
    print(f"{'shape':<14} {'T':>5} {'combine us':>11} {'torch.sum us':>13} {'x':>6} {'% copy':>7}")
    for r in rows:
        print(
            f"{r['shape']:<14} {r['tokens']:>5} {r['combine_us']:>11.2f} {r['torch_sum_us']:>13.2f} "
            f"{r['speedup']:>6.2f} {r['pct_copy']:>7.1f}"
        )
    return dict(copy_TBps=copy_bw / 1e12, top_k=TOP_K, rows=rows)


if __name__ == "__main__":
    main()
