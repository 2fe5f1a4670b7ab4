"""Tiles of the MXFP4 expert GEMMs (Triton's scaled dot on bf16 activations) and one token's GEMVs
(mxfp4_gemv.py), timed as a step runs them (picks fused.mxfp4_tile_config's rows and gemv_config).

  python -m benchmarks run sweep_moe_mxfp4 [-- --tokens 1 8 64 512] [--gemv-only]

gpt-oss-120b's experts (128, top-4, hidden = intermediate = 2880) with its biases and clamped SwiGLU:
fused_experts over MXFP4 bytes for T tokens, captured for a CUDA graph over 16 routings drawn anew per
call (the experts' bytes come from DRAM, as in a step whose layers each touch other experts) and replayed
(graph_timing.py). Gate/up and down share one tile shape. % of copy: the hit experts' MXFP4 bytes and
scales over the copy bandwidth measured in the same run; the bf16 experts at their default tiles are the
baseline.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from atom_kernels import fused_experts
from atom_kernels.moe import ExpertActivation, ExpertBiases, ExpertMxfp4, TileConfig, quantize_mxfp4
from atom_kernels.moe.combine import combine_topk
from atom_kernels.moe.mxfp4_gemv import GemvConfig, gemv_takes, mxfp4_gemv_experts
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms

EXPERTS, TOP_K, HIDDEN, INTER = 128, 4, 2880, 2880
ROUTINGS = 16
SWIGLU = ExpertActivation("swiglu_oai", alpha=1.702, limit=7.0)


def _tiles(tokens: int) -> list[TileConfig]:
    """Decode's one-row-a-pair tiles over widths, k-steps, warps and stages; past 8 rows an expert, taller
    tiles at 8 warps (fewer do not fit unpacked MXFP4 tiles beside the accumulators)."""
    if tokens * TOP_K / EXPERTS <= 8:
        grid = itertools.product((16,), (32, 64, 128), (64, 128, 256), (4, 8), (3, 4))
    else:
        grid = itertools.product((32, 64), (64, 128), (64, 128), (8,), (3, 4))
    return [TileConfig(bm, bn, bk, num_warps=w, num_stages=s) for bm, bn, bk, w, s in grid]


def _gemv_configs() -> list[GemvConfig]:
    """One token's GEMV over output columns a program, k-step and warps."""
    grid = itertools.product((16, 32, 64), (128, 256, 512), (2, 4, 8))
    return [GemvConfig(bn, bk, w) for bn, bk, w in grid if bn * bk // 2 >= 32 * 16 * w]


def _timed(calls, first_out, want) -> float:
    """Microseconds per call over the routings, after checking the first call's output."""
    calls[0]()
    torch.testing.assert_close(first_out, want, rtol=3e-2, atol=3e-2)
    return graph_ms(calls) * 1e3


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512])
    parser.add_argument("--gemv-only", action="store_true", help="the GEMVs' configs, not the tiles'")
    args = parser.parse_args()
    copy_bw, _ = measure_ceilings()
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, **bf16) / HIDDEN**0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, **bf16) / INTER**0.5
    parts = [quantize_mxfp4(w13[e : e + 8]) for e in range(0, EXPERTS, 8)]
    q13, s13 = torch.cat([b for b, _ in parts]), torch.cat([s for _, s in parts])
    parts = [quantize_mxfp4(w2[e : e + 8]) for e in range(0, EXPERTS, 8)]
    q2, s2 = torch.cat([b for b, _ in parts]), torch.cat([s for _, s in parts])
    mx = ExpertMxfp4(s13, s2)
    d13, d2 = mx.dequantize(q13, q2, torch.bfloat16)  # the bf16 baseline: the same experts
    del w13, w2
    biases = ExpertBiases(
        0.1 * torch.randn(EXPERTS, 2 * INTER, **bf16), 0.1 * torch.randn(EXPERTS, HIDDEN, **bf16)
    )
    common = dict(activation=SWIGLU, biases=biases)
    records = []
    for tokens in args.tokens:
        x = torch.randn(tokens, HIDDEN, **bf16)
        routings = []
        for _ in range(ROUTINGS):
            ids = torch.rand(tokens, EXPERTS, device="cuda").topk(TOP_K, dim=-1).indices.to(torch.int32)
            routings.append((torch.softmax(torch.randn(tokens, TOP_K, device="cuda"), dim=-1), ids))
        hit = sum(ids.unique().numel() for _, ids in routings) / ROUTINGS
        values = 3 * HIDDEN * INTER
        mx_bytes, bf16_bytes = hit * (values // 2 + values // 32), hit * values * 2
        want = fused_experts(x, d13, d2, *routings[0], **common).clone()
        out = torch.empty_like(x)

        def calls(w_a, w_b, x=x, out=out, routings=routings, **kw):
            return [lambda r=r: fused_experts(x, w_a, w_b, *r, out=out, **common, **kw) for r in routings]

        results = {"bf16 default": _timed(calls(d13, d2), out, want)}
        results["mxfp4 default"] = _timed(calls(q13, q2, mxfp4=mx), out, want)
        if gemv_takes(tokens, TOP_K, EXPERTS):  # the GEMVs (mxfp4_gemv.py), as fused_experts calls them
            for gemv in _gemv_configs():

                def gemv_calls(gemv=gemv, x=x, out=out, routings=routings):
                    def run(w, topk_ids):
                        y = mxfp4_gemv_experts(
                            x,
                            q13,
                            q2,
                            topk_ids,
                            w.reshape(-1).float(),
                            mx,
                            gemv,
                            biases=biases,
                            activation=SWIGLU,
                        )
                        return combine_topk(y, TOP_K, out)

                    return [lambda r=r: run(*r) for r in routings]

                try:
                    results[f"gemv {gemv}"] = _timed(gemv_calls(), out, want)
                except AssertionError:  # a wrong result is a bug, never a config to skip
                    raise
                except Exception as exc:  # registers or shared memory this GPU lacks: named, skipped
                    print(f"  {gemv}: {type(exc).__name__}: {str(exc)[:120]}")
        for cfg in [] if args.gemv_only else _tiles(tokens):
            try:
                results[str(cfg)] = _timed(calls(q13, q2, mxfp4=mx, config=cfg, down_config=cfg), out, want)
            except AssertionError:
                raise
            except Exception as exc:  # a shape this GPU cannot run (shared memory, registers): named, skipped
                print(f"  {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
        ranked = sorted(((k, v) for k, v in results.items() if k != "bf16 default"), key=lambda kv: kv[1])
        print(
            f"\nT={tokens}: {hit:.1f} experts a call, MXFP4 {mx_bytes / 1e6:.1f} MB, bf16 {bf16_bytes / 1e6:.1f} MB"
        )
        print(
            f"  {results['bf16 default']:8.2f} us {bf16_bytes / (results['bf16 default'] * 1e-6) / copy_bw * 100:5.1f}% bf16 default"
        )
        for label, us in ranked[:8] + [kv for kv in ranked if kv[0] == "mxfp4 default"]:
            pct = mx_bytes / (us * 1e-6) / copy_bw * 100
            print(f"  {us:8.2f} us {pct:5.1f}% of copy  {label}", flush=True)
        records.append(
            dict(tokens=tokens, experts_hit=hit, mxfp4_bytes=mx_bytes, results_us=dict(ranked), best=ranked[0][0],
                 bf16_default_us=results["bf16 default"])
        )  # fmt: skip
    return dict(device=torch.cuda.get_device_name(), copy_bw_gbs=copy_bw / 1e9, cases=records)


if __name__ == "__main__":
    main()
