"""Tile sweep for fp8_linear's kernels on the H200 (how stream_tiles and gemm_tiles were chosen).

  python -m benchmarks run sweep_fp8_linear

Times each candidate as CUDA-graph replays over weight copies that miss the L2 (graph_timing) at 1 row
(GEMV), 8 rows (skinny) and 4096 rows (the W8A8 GEMM alone, x quantized beforehand), and prints the best
beside the current default for each shape.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from atom_kernels.fp8 import quantize_act, quantize_weight_ref
from atom_kernels.fp8.gemm import GemmTiles, gemm_tiles, w8a8_gemm
from atom_kernels.fp8.stream import StreamTiles, run_stream, stream_tiles
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms, rotation

BLOCK = (128, 128)
SHAPES = {"llama3-8b/qkv": (6144, 4096), "llama3-8b/down": (4096, 14336), "llama3-8b/gate_up": (28672, 4096)}
GEMV = [
    StreamTiles(bn, 128, step // 128, True, w, st)
    for bn, step, w, st in itertools.product((8, 16, 32), (512, 1024), (4, 8), (1, 3))
]
SKINNY = [
    StreamTiles(bn, 128, subs, True, w, st)
    for bn, subs, w, st in itertools.product((32, 64, 128), (1, 2, 4), (4, 8), (3, 5))
]
GEMM = [
    GemmTiles(bm, bn, group_m=8, num_warps=w, num_stages=st)
    for bm, bn, w, st in (
        (64, 128, 4, 3),
        (64, 128, 4, 4),
        (64, 256, 8, 3),
        (128, 128, 4, 3),
        (128, 128, 8, 3),
        (128, 128, 8, 4),
        (128, 256, 8, 3),
        (256, 128, 8, 3),
    )
]


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    copy_bw, _ = measure_ceilings()
    results = []
    for name, (n, k) in SHAPES.items():
        torch.manual_seed(0)
        q, s = quantize_weight_ref(torch.randn(n, k, device="cuda") / k**0.5, BLOCK)
        copies = [(q.clone(), s.clone()) for _ in range(rotation(q.numel()))]
        for rows, candidates in ((1, GEMV), (8, SKINNY)):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            default = stream_tiles(rows, n, k, BLOCK[1])
            timed = []
            for t in [default, *candidates]:
                try:
                    calls = [
                        lambda qc=qc, sc=sc, t=t, x=x, y=y: run_stream(x, qc, sc, BLOCK, None, y, tiles=t)
                        for qc, sc in copies
                    ]
                    timed.append((graph_ms(calls), t))
                except Exception as exc:  # a shape this GPU cannot compile (registers, shared memory)
                    print(f"  {name} rows={rows} {t}: {type(exc).__name__}")
            best_ms, best = min(timed, key=lambda p: p[0])
            pct = 100 * (q.numel() + s.numel() * 4) / (best_ms * 1e-3) / copy_bw
            row = dict(
                shape=name,
                rows=rows,
                default=str(default),
                default_ms=timed[0][0],
                best=str(best),
                best_ms=best_ms,
                best_pct_copy=pct,
            )
            results.append(row)
            print(row, flush=True)
        xq, xs = quantize_act(torch.randn(4096, k, device="cuda", dtype=torch.bfloat16), BLOCK[1])
        default = gemm_tiles(4096)
        timed = []
        for t in [default, *GEMM]:
            try:
                timed.append(
                    (
                        graph_ms(
                            [lambda t=t, xq=xq, xs=xs, q=q, s=s: w8a8_gemm(xq, xs, q, s, BLOCK, tiles=t)]
                        ),
                        t,
                    )
                )
            except Exception as exc:
                print(f"  {name} gemm {t}: {type(exc).__name__}")
        best_ms, best = min(timed, key=lambda p: p[0])
        tflops = 2 * 4096 * n * k / (best_ms * 1e-3) / 1e12
        row = dict(
            shape=name,
            rows=4096,
            default=str(default),
            default_ms=timed[0][0],
            best=str(best),
            best_ms=best_ms,
            best_tflops=tflops,
            all=[(str(t), ms) for ms, t in timed],
        )
        results.append(row)
        print({key: v for key, v in row.items() if key != "all"}, flush=True)
        del copies
        torch.cuda.empty_cache()
    return results


if __name__ == "__main__":
    main()
