"""Decode's few rows on the H200: the W8A8 skinny kernel (x quantized, e4m3 tiles straight into the MMA)
against the weight-only streaming kernels and bf16, with a tile sweep for the W8A8 kernel.

  python -m benchmarks run sweep_fp8_skinny -- [--rows 1 4 16]

Every call is timed as CUDA-graph replays over weight copies that miss the L2 (graph_timing). The W8A8
time includes quantize_act of x (its own launch). % copy: the e4m3 weight and fp32 scales over the copy
bandwidth measured in the same run; x bf16: bf16's time over this one (x @ W^T, torch). cuBLAS ms: the
blockwise-scaled cuBLAS GEMM that fp8_linear takes past the skinny kernel's rows (its quantize_act
included), where it runs the shape: the two meet at the row count this sweep sets.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from atom_kernels.fp8 import fp8_linear_ref, quantize_act, quantize_weight_ref
from atom_kernels.fp8.cublas_blockwise import cublas_blockwise_supported, cublas_w8a8
from atom_kernels.fp8.skinny_w8a8 import SkinnyTiles, skinny_tiles, w8a8_skinny
from atom_kernels.fp8.stream import run_stream
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.fp8_shapes import SHAPES
from benchmarks.harness.graph_timing import graph_ms, rotation

BLOCK = (128, 128)
ROWS = (1, 4, 16)
CANDIDATES = [
    SkinnyTiles(bn, split, w, st)
    for bn, split, w, st in itertools.product((32, 64, 128), (1, 2, 4), (4, 8), (3, 5))
    if not (bn == 32 and w == 8)
]


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    parser.add_argument("names", nargs="*", default=list(SHAPES))
    args = parser.parse_args()
    copy_bw, _ = measure_ceilings()
    results = []
    for name in args.names:
        n, k = SHAPES[name]
        torch.manual_seed(0)
        w = torch.randn(n, k, device="cuda") / k**0.5
        q, s = quantize_weight_ref(w, BLOCK)
        wb = w.to(torch.bfloat16)
        del w
        copies = [(q.clone(), s.clone()) for _ in range(rotation(q.numel()))]
        bf_copies = [wb.clone() for _ in range(rotation(2 * wb.numel()))]
        fp8_bytes = q.numel() + 4 * s.numel()
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            bf16_ms = graph_ms([lambda c=c, x=x: torch.mm(x, c.t()) for c in bf_copies])
            stream_ms = graph_ms(
                [lambda qc=qc, sc=sc, x=x, y=y: run_stream(x, qc, sc, BLOCK, None, y) for qc, sc in copies]
            )
            want = fp8_linear_ref(x, q, s, BLOCK, quantize_input=True).float()
            cublas_ms = float("nan")
            if cublas_blockwise_supported(n, k, BLOCK, x.dtype, x.device):
                cublas_ms = graph_ms([lambda qc=qc, sc=sc, x=x: cublas_w8a8(x, qc, sc) for qc, sc in copies])
            timed = []
            for t in [skinny_tiles(n, k, BLOCK[1], rows), *CANDIDATES]:

                def call(qc, sc, t=t, x=x):
                    xq, xs = quantize_act(x, BLOCK[1])
                    return w8a8_skinny(xq, xs, qc, sc, BLOCK, out_dtype=torch.bfloat16, tiles=t)

                try:
                    got = call(q, s).float()
                    err = ((got - want).abs().max() / want.abs().max()).item()
                    if err > 2e-2:
                        print(f"  {name} rows={rows} {t}: wrong, rel err {err:.3g}")
                        continue
                    timed.append((graph_ms([lambda qc=qc, sc=sc: call(qc, sc) for qc, sc in copies]), t))
                except Exception as exc:  # a tile this GPU cannot compile (registers, shared memory)
                    print(f"  {name} rows={rows} {t}: {type(exc).__name__}")
            best_ms, best = min(timed, key=lambda p: p[0])
            row = dict(
                shape=name,
                rows=rows,
                bf16_ms=bf16_ms,
                stream_ms=stream_ms,
                stream_pct_copy=100 * fp8_bytes / (stream_ms * 1e-3) / copy_bw,
                cublas_ms=cublas_ms,
                default=str(timed[0][1]),
                default_ms=timed[0][0],
                best=str(best),
                best_ms=best_ms,
                best_pct_copy=100 * fp8_bytes / (best_ms * 1e-3) / copy_bw,
                best_x_bf16=bf16_ms / best_ms,
                best_x_stream=stream_ms / best_ms,
            )
            results.append(row)
            print(row, flush=True)
        del copies, bf_copies
        torch.cuda.empty_cache()
    print(f"\ncopy {copy_bw / 1e12:.2f} TB/s")
    print(
        f"{'shape':<18} {'M':>3} {'bf16 ms':>8} {'stream ms':>9} {'%copy':>6} {'w8a8 ms':>8} {'%copy':>6} "
        f"{'x bf16':>7} {'x strm':>7} {'cuBLAS':>8}  best tile"
    )
    for r in results:
        print(
            f"{r['shape']:<18} {r['rows']:>3} {r['bf16_ms']:>8.4f} {r['stream_ms']:>9.4f} "
            f"{r['stream_pct_copy']:>6.1f} {r['best_ms']:>8.4f} {r['best_pct_copy']:>6.1f} "
            f"{r['best_x_bf16']:>7.2f} {r['best_x_stream']:>7.2f} {r['cublas_ms']:>8.4f}  {r['best']}"
        )
    return dict(copy_TBps=copy_bw / 1e12, rows=results)


if __name__ == "__main__":
    main()
