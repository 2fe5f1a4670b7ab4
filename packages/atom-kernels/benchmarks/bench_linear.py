"""Linear layers at decode's row counts: atom_kernels.linear against cuBLAS (F.linear), as graph replays.

  python -m benchmarks run linear -- [--sweep]

Llama-3-8B's projections and Qwen3-30B-A3B's dense ones (a3b_*; bf16). Each call reads the whole weight, so the roofline is the weight's bytes at
the copy bandwidth measured in the same run. The down projection takes the gated MLP's [M, 2I]
pre-activation: the baseline is silu_and_mul then cuBLAS, the kernel applies the activation in its load.
Weights rotate over copies that exceed the L2, as in a decode step where every layer's weights stream.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import time

import torch
import torch.nn.functional as F
import triton

from atom_kernels import silu_and_mul
from atom_kernels.linear import linear
from atom_kernels.linear.skinny import MAX_SKINNY_ROWS, SkinnyTiles, run_skinny, skinny_tiles
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms, rotation

SHAPES = {  # name: (N, K, gated input)
    "qkv": (6144, 4096, False),
    "o": (4096, 4096, False),
    "gate_up": (28672, 4096, False),
    "down": (4096, 14336, True),
    "lm_head": (128256, 4096, False),
    # Qwen3-30B-A3B's dense projections (its experts are fused_experts'): hidden 2048
    "a3b_qkv": (5120, 2048, False),
    "a3b_o": (2048, 4096, False),
    "a3b_router": (128, 2048, False),
    "a3b_lm_head": (151936, 2048, False),
}
ROWS = (1, 2, 4, 8, 16, 32, 48, 64)


def candidates(rows: int) -> list[SkinnyTiles]:
    if rows == 1:
        grid = itertools.product((4, 8, 16), (256, 512, 1024), (4, 8), (1, 3))
    else:  # weight rows per program, K step, warps, stages, splits of K
        grid = itertools.product((64, 128), (64, 128, 256), (4,), (3, 4, 5, 6), (1, 2, 4, 8))
    return [SkinnyTiles(*t) for t in grid]


def sweep(name: str, weights: list[torch.Tensor], gated: bool, copy_bw: float, row_counts=(1, 4, 16)) -> None:
    n, k = weights[0].shape
    for rows in row_counts:
        fused = gated and rows == 1  # the activation is fused at one row only
        x = torch.randn(rows, 2 * k if fused else k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
        found = []
        for tiles in candidates(rows):
            try:
                ms = graph_ms(
                    [
                        lambda w=w, x=x, y=y, t=tiles, g=fused: run_skinny(
                            x, w, None, y, gated_input=g, tiles=t
                        )
                        for w in weights
                    ]
                )
            except triton.runtime.errors.OutOfResources:
                continue
            found.append((ms, tiles))
        found.sort(key=lambda f: f[0])
        for ms, t in found[:4]:
            pct = n * k * 2 / (ms * 1e-3) / copy_bw * 100
            print(
                f"  sweep {name:8} M={rows:2} BN={t.block_n:3} BK={t.block_k:4} warps={t.warps} "
                f"stages={t.stages} splits={t.splits}: {ms * 1000:7.1f} us {pct:5.1f}%"
            )


def host_us_per_call(calls: int = 2000) -> dict[str, float]:
    """Host microseconds per eager call at one row on a tiny weight: what an eager decode step pays per layer."""
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    x2 = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    out = {}
    for name, fn in (
        ("F.linear", lambda: F.linear(x, w)),
        ("linear", lambda: linear(x, w)),
        ("silu_and_mul", lambda: silu_and_mul(x2)),
    ):
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - start) / calls * 1e6
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true", help="time tile candidates first")
    parser.add_argument("--sweep-rows", default="1,4,16", help="row counts the sweep times")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts the table times")
    parser.add_argument("names", nargs="*", default=list(SHAPES))
    args = parser.parse_args()
    copy_bw, _ = measure_ceilings()
    torch.manual_seed(0)
    rows_out = []
    for name in args.names:
        n, k, gated = SHAPES[name]
        nbytes = n * k * 2
        weights = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(rotation(nbytes))
        ]
        if args.sweep:
            sweep(name, weights, gated, copy_bw, [int(r) for r in args.sweep_rows.split(",")])
        for rows in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(rows, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)

            def cublas(w, x=x, gated=gated):
                return F.linear(silu_and_mul(x) if gated else x, w)

            # the kernel with skinny_tiles' choice, whether linear() takes it at these rows or not
            def kernel(w, x=x, gated=gated, rows=rows, n=n, k=k):
                h = silu_and_mul(x) if gated and rows > 1 else x
                y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
                run_skinny(h, w, None, y, gated_input=gated and rows == 1, tiles=skinny_tiles(rows, k, n))

            base = graph_ms([lambda w=w: cublas(w) for w in weights])
            ours = graph_ms([lambda w=w, x=x, g=gated: linear(x, w, gated_input=g) for w in weights])
            forced = graph_ms([lambda w=w: kernel(w) for w in weights]) if rows <= MAX_SKINNY_ROWS else None
            err = (
                (linear(x, weights[0], gated_input=gated).float() - cublas(weights[0]).float())
                .abs()
                .max()
                .item()
            )
            rows_out.append(
                dict(
                    name=name,
                    n=n,
                    k=k,
                    gated=gated,
                    rows=rows,
                    cublas_us=base * 1e3,
                    atom_us=ours * 1e3,
                    kernel_us=forced * 1e3 if forced else None,
                    atom_pct_copy=nbytes / (ours * 1e-3) / copy_bw * 100,
                    cublas_pct_copy=nbytes / (base * 1e-3) / copy_bw * 100,
                    speedup=base / ours,
                    max_abs_diff=err,
                )
            )
        del weights
        torch.cuda.empty_cache()
    host = host_us_per_call()
    print(f"\n{torch.cuda.get_device_name()}  copy {copy_bw / 1e12:.2f} TB/s (read + write)")
    print(
        f"{'layer':8} {'N':>6} {'K':>6} {'M':>3} {'cuBLAS us':>10} {'% copy':>7} {'ATOM us':>8} {'% copy':>7} {'x':>5}"
        f" {'kernel us':>9}"
    )
    for r in rows_out:
        print(
            f"{r['name'] + ('*' if r['gated'] else ''):8} {r['n']:6} {r['k']:6} {r['rows']:3} {r['cublas_us']:10.1f} "
            f"{r['cublas_pct_copy']:7.1f} {r['atom_us']:8.1f} {r['atom_pct_copy']:7.1f} {r['speedup']:5.2f}"
            f" {r['kernel_us'] or float('nan'):9.1f}"
        )
    print("* gated input: cuBLAS column includes silu_and_mul (as do ATOM's past one row)")
    print("kernel: the weight-streaming kernel with skinny_tiles' choice, where linear() takes it or not")
    print(
        "host time per eager call (tiny weight, GPU idle): "
        + ", ".join(f"{k} {v:.1f} us" for k, v in host.items())
    )
    return dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        triton=triton.__version__,
        copy_tb_s=copy_bw / 1e12,
        host_us_per_call=host,
        rows=rows_out,
    )


if __name__ == "__main__":
    main()
