"""The token-by-expert ordering of a MoE layer on the H200: one program vs the multi-launch path.

  python -m benchmarks run moe_order

Each row is order_by_expert for T tokens' top-k ids, timed as a decode step runs it: 50 calls captured in
one CUDA graph, replayed, GPU time per call (launch gaps included), for both paths on the same ids. The
one-program path replaces a memset and three launches with one launch; it does all the work on one SM,
so it loses once there are many pairs: where it stops winning sets SMALL_ORDER_PAIRS. A table is printed
last.
"""

from __future__ import annotations

import argparse
import datetime

import torch

from atom_kernels.moe.align import SMALL_ORDER_PAIRS, order_by_expert

CASES = [  # experts, k, block_m (tile_config's for decode), tokens
    (128, 8, 16, t) for t in (1, 4, 16, 32, 64, 128, 256)
] + [(256, 8, 16, t) for t in (1, 16, 64, 128)]
CALLS = 50


def per_call_us(ids: torch.Tensor, experts: int, block_m: int, one_program: bool) -> float:
    order_by_expert(ids, experts, block_m, one_program=one_program)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            order_by_expert(ids, experts, block_m, one_program=one_program)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return sorted(times)[len(times) // 2]


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for experts, k, block_m, tokens in CASES:
        scores = torch.rand(tokens, experts, device="cuda", generator=gen)
        ids = scores.topk(k, dim=-1).indices.to(torch.int32)
        one = per_call_us(ids, experts, block_m, True)
        multi = per_call_us(ids, experts, block_m, False)
        rows.append(
            dict(
                experts=experts,
                k=k,
                tokens=tokens,
                pairs=tokens * k,
                one_program_us=one,
                multi_launch_us=multi,
            )
        )
        print(rows[-1], flush=True)
    record = dict(
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(),
        small_order_pairs=SMALL_ORDER_PAIRS,
        rows=rows,
    )
    print(
        f"\n{record['device']}: order_by_expert per call in a CUDA graph (us); one program up to {SMALL_ORDER_PAIRS} pairs"
    )
    print(f"{'E':>4} {'T':>4} {'pairs':>6} {'one program':>12} {'multi-launch':>13} {'x':>6}")
    for r in rows:
        print(
            f"{r['experts']:>4} {r['tokens']:>4} {r['pairs']:>6} {r['one_program_us']:>12.2f} "
            f"{r['multi_launch_us']:>13.2f} {r['multi_launch_us'] / r['one_program_us']:>6.2f}"
        )
    return record


if __name__ == "__main__":
    main()
