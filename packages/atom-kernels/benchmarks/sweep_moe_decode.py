"""Expert-GEMM tiles for decode's few tokens, timed as a decode step runs them (picks tile_config's decode rows).

  python -m benchmarks run sweep_moe_decode

Each case is fused_experts for T tokens' top-8 routing (bf16), captured for a CUDA graph over 16 routings
drawn anew per call (so the experts' weights come from DRAM, as in a decode step whose layers each
touch other experts) and replayed (graph_timing.py). First the gate/up and down GEMMs share one tile
shape; then, from the best of those, the down GEMM's shape alone varies. % of copy: the bytes of the
experts hit over the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from atom_kernels import fused_experts
from atom_kernels.moe import TileConfig, tile_config
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms

CASES = [  # name, experts, k, hidden, intermediate, tokens
    ("Qwen3-30B-A3B", 128, 8, 2048, 768, 1),
    ("Qwen3-30B-A3B", 128, 8, 2048, 768, 4),
    ("DeepSeek-V3", 256, 8, 7168, 2048, 1),
]
SHARED = [
    TileConfig(16, bn, bk, num_warps=w, num_stages=s)
    for bn, bk, w, s in itertools.product((16, 32, 64), (64, 128, 256), (2, 4), (4,))
]
ROUTINGS = 16


def _timed(x, w13, w2, routings, want, cfg, down=None) -> float:
    """Microseconds per call over the routings, after checking the first call's output."""
    out = torch.empty_like(x)
    calls = [
        lambda r=r: fused_experts(x, w13, w2, *r, out=out, config=cfg, down_config=down) for r in routings
    ]
    calls[0]()
    torch.testing.assert_close(out, want, rtol=3e-2, atol=3e-2)
    return graph_ms(calls) * 1e3


def sweep_case(name: str, experts: int, k: int, hidden: int, inter: int, tokens: int, copy_bw: float) -> dict:
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, hidden, **bf16)
    w13 = torch.randn(experts, 2 * inter, hidden, **bf16) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, **bf16) / inter**0.5
    routings = []
    for _ in range(ROUTINGS):
        ids = torch.rand(tokens, experts, device="cuda").topk(k, dim=-1).indices.to(torch.int32)
        routings.append((torch.softmax(torch.randn(tokens, k, device="cuda"), dim=-1), ids))
    hit = sum(ids.unique().numel() for _, ids in routings) / ROUTINGS
    bytes_per_call = hit * 3 * hidden * inter * 2
    want = fused_experts(x, w13, w2, *routings[0]).clone()
    default = tile_config(tokens * k, experts, one_token=tokens == 1)
    results = {f"default {default}": _timed(x, w13, w2, routings, want, default)}
    for cfg in SHARED:
        try:
            results[str(cfg)] = _timed(x, w13, w2, routings, want, cfg)
        except Exception as exc:  # a shape this GPU cannot run (shared memory): skipped, named
            print(f"  {cfg}: {type(exc).__name__}")
    best = min((c for c in SHARED if str(c) in results), key=lambda c: results[str(c)])
    for bn, bk, w, st in itertools.product((32, 64, 128), (128, 256), (4,), (3, 4)):
        down = TileConfig(16, bn, bk, num_warps=w, num_stages=st)
        try:
            results[f"{best} + down {down}"] = _timed(x, w13, w2, routings, want, best, down)
        except Exception as exc:
            print(f"  down {down}: {type(exc).__name__}")
    ranked = sorted(results.items(), key=lambda kv: kv[1])
    print(f"\n{name} T={tokens}: {hit:.1f} experts a call, {bytes_per_call / 1e6:.1f} MB")
    for label, us in ranked[:8] + [(kk, v) for kk, v in ranked if kk.startswith("default")]:
        print(
            f"  {us:8.2f} us {bytes_per_call / (us * 1e-6) / copy_bw * 100:5.1f}% of copy  {label}",
            flush=True,
        )
    return dict(
        case=f"{name} T={tokens}",
        experts_hit=hit,
        bytes=bytes_per_call,
        results_us=dict(ranked),
        best=ranked[0][0],
        default=str(default),
    )


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    copy_bw, _ = measure_ceilings()
    records = [sweep_case(*case, copy_bw) for case in CASES]
    return dict(device=torch.cuda.get_device_name(), copy_bw_gbs=copy_bw / 1e9, cases=records)


if __name__ == "__main__":
    main()
