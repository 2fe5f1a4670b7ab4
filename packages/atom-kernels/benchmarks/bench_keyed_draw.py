"""Sampled tokens on a decode step's logits: atom-kernels' keyed_draw (no sort) against the sort-based
torch draw atom-core's sampler ran before (softmax, a full sort for top-p, a float64 CDF, searchsorted).

  python -m benchmarks run keyed_draw

Each case draws every row with temperature 0.8 and top-p 0.95 (and top-k 50 where named) from bf16 logits
(random, scaled like a model's), greedy_tokens first as the engine runs it. Times are device times of
calls replayed from a CUDA graph (graph_timing.py: inputs rotated so each call reads its logits from
DRAM). GB/s: one read of the logits over the kernel's time; % of copy against the copy bandwidth measured
in the same run (a draw reads the row about three times: max, masses, a chunk a round).
"""

from __future__ import annotations

import argparse

import torch

from atom_kernels.sampling import greedy_tokens, keyed_draw
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms, rotation

CASES = [(1, 128256, 0), (1, 151936, 0), (64, 151936, 0), (64, 151936, 50), (256, 151936, 0)]
TEMPERATURE, TOP_P = 0.8, 0.95


def sorted_draw(logits: torch.Tensor, uniforms: torch.Tensor, top_k: int) -> torch.Tensor:
    """The draw the engine ran before keyed_draw: filters by sorting, then the inverse CDF in float64."""
    x = logits.float()
    x = (x - x.max(dim=-1, keepdim=True).values) / TEMPERATURE
    if top_k:
        kth = x.topk(top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    outside = sorted_probs.cumsum(-1) - sorted_probs > TOP_P
    probs = probs.scatter(1, order, sorted_probs.masked_fill(outside, 0))
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)[:, 0]


def time_case(rows: int, vocab: int, top_k: int, copy_bw: float) -> dict:
    """One case's device times (keyed_draw, sorted draw), printed as a table row."""
    copies = [
        torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16) * 3
        for _ in range(rotation(rows * vocab * 2))
    ]
    at = torch.arange(rows, device="cuda")
    temperature = torch.full((rows,), TEMPERATURE, device="cuda")
    top_p = torch.full((rows,), TOP_P, device="cuda")
    min_p = torch.zeros(rows, device="cuda")
    top_ks = torch.full((rows,), top_k or -1, device="cuda", dtype=torch.int64)
    keys = torch.randint(-(2**63), 2**63 - 1, (rows,), device="cuda", dtype=torch.int64)
    uniforms = torch.rand(rows, device="cuda", dtype=torch.float64)

    def draw(x):
        out = greedy_tokens(x)
        return keyed_draw(x, at, temperature, top_ks, top_p, min_p, keys, out, top_k_max=top_k)

    kernel = graph_ms([lambda x=x: draw(x) for x in copies]) * 1e3
    ref = graph_ms([lambda x=x: sorted_draw(x, uniforms, top_k) for x in copies]) * 1e3
    gbs = rows * vocab * 2 / (kernel * 1e-6) / 1e9
    pct = gbs * 1e9 / copy_bw * 100
    print(
        f"{rows:>5} x {vocab:<6} {top_k or '-':>5} {kernel:>10.2f} {gbs:>7.0f} {pct:>6.0f}% {ref:>10.2f}"
        f" {ref / kernel:>5.1f}x"
    )
    return dict(
        rows=rows, vocab=vocab, top_k=top_k, kernel_us=kernel, sorted_us=ref, gbs=gbs, pct_of_copy=pct
    )


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    copy_bw, _ = measure_ceilings()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    print(
        f"{'rows x vocab':>14} {'top-k':>5} {'kernel us':>10} {'GB/s':>7} {'% copy':>7} {'sorted us':>10} {'x':>6}"
    )
    cases = [time_case(rows, vocab, top_k, copy_bw) for rows, vocab, top_k in CASES]
    return dict(
        device=torch.cuda.get_device_name(),
        copy_bw_gbs=copy_bw / 1e9,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        cases=cases,
    )


if __name__ == "__main__":
    main()
