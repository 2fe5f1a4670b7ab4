"""Fused MoE on the H200 (issue targets): the experts of one MoE layer, and the routing kernels.

  python -m benchmarks run moe -- [--sweep]

Experts: median device time of fused_experts (routing given) replayed from a CUDA graph, as engines run
decode (the eager time, host launch cost included, is reported beside it), against a per-expert torch loop on the same
data in the same run (one gate/up matmul, SiLU-and-mul, down matmul and index_add per expert hit: what
atom-core ran before). Roofline: max(bytes of the experts hit / copy bandwidth, FLOPs / bf16 matmul
rate), both measured in this run. Routing: topk_softmax and grouped_topk against eager torch.
--sweep first times a few tile shapes per case and reports the best (how tile_config was chosen).
A table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import torch
import torch.nn.functional as F
import triton

from atom_kernels import fused_experts, grouped_topk, topk_softmax
from atom_kernels.moe import GroupedRouting, TileConfig, tile_config
from atom_kernels.moe.ref import grouped_topk_ref, topk_softmax_ref
from benchmarks.harness.ceilings import measure_ceilings

DEV = torch.device("cuda")
BF16 = dict(device=DEV, dtype=torch.bfloat16)
CASES = [  # name, experts, k, hidden, intermediate, tokens
    ("Qwen3-30B-A3B", 128, 8, 2048, 768, 1),
    ("Qwen3-30B-A3B", 128, 8, 2048, 768, 64),
    ("Qwen3-30B-A3B", 128, 8, 2048, 768, 4096),
    ("DeepSeek-V3", 256, 8, 7168, 2048, 64),
]
SWEEP = [
    TileConfig(bm, bn, bk, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in (
        (16, 64, 128, 4, 4),
        (16, 128, 64, 4, 4),
        (16, 32, 256, 4, 3),
        (32, 64, 128, 4, 4),
        (64, 64, 64, 4, 4),
        (64, 128, 64, 4, 3),
        (128, 128, 64, 8, 3),
        (128, 128, 64, 8, 4),
        (128, 64, 64, 4, 3),
        (64, 128, 64, 8, 4),
        (128, 128, 32, 8, 4),
    )
]


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")


def bench_graph(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def torch_loop(x, w13, w2, weights, ids):
    """The per-expert baseline in bf16 (a host sync to list the experts hit, as eager engines do)."""
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    for expert in ids.unique().tolist():
        token, slot = (ids == expert).nonzero(as_tuple=True)
        h = F.linear(x[token], w13[expert])
        h = F.silu(h[:, :inter]) * h[:, inter:]
        out.index_add_(0, token, F.linear(h, w2[expert]) * weights[token, slot, None].to(x.dtype))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    copy_bw, mm_rate = measure_ceilings()
    rows, sweeps = [], []
    for name, experts, k, hidden, inter, tokens in CASES:
        torch.manual_seed(0)
        x = torch.randn(tokens, hidden, **BF16)
        w13 = torch.randn(experts, 2 * inter, hidden, **BF16) / hidden**0.5
        w2 = torch.randn(experts, hidden, inter, **BF16) / inter**0.5
        ids = torch.rand(tokens, experts, device=DEV).topk(k, dim=-1).indices.to(torch.int32)
        weights = torch.softmax(torch.randn(tokens, k, device=DEV), dim=-1)
        out = torch.empty_like(x)
        ref = torch_loop(x, w13, w2, weights, ids.long())
        got = fused_experts(x, w13, w2, weights, ids, out=out)
        err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        assert err < 2e-2, f"{name} T={tokens}: fused_experts differs from the torch loop (rel {err:.3g})"
        shape = f"{name} T={tokens}"
        if args.sweep:
            timed = []
            for cfg in SWEEP:
                try:
                    timed.append(
                        (bench(partial(fused_experts, x, w13, w2, weights, ids, out=out, config=cfg)), cfg)
                    )
                except Exception as exc:  # a tile shape this GPU cannot run (shared memory): skip it
                    print(f"  sweep {shape} {cfg}: {type(exc).__name__}")
            best_cfg = min(timed, key=lambda t: t[0])[1]
            for bn, bk, w, st in (
                (128, 64, 8, 3),
                (256, 64, 8, 3),
                (128, 128, 8, 3),
                (256, 32, 8, 4),
                (64, 128, 4, 4),
            ):
                dcfg = TileConfig(best_cfg.block_m, bn, bk, num_warps=w, num_stages=st)
                try:
                    fn = partial(
                        fused_experts, x, w13, w2, weights, ids, out=out, config=best_cfg, down_config=dcfg
                    )
                    timed.append((bench_graph(fn), f"{best_cfg} + down {dcfg}"))
                except Exception as exc:
                    print(f"  sweep {shape} down {dcfg}: {type(exc).__name__}")
            timed.sort(key=lambda t: t[0])
            chosen = tile_config(tokens * k, experts, x.element_size())
            sweeps.append(
                dict(
                    case=shape,
                    chosen=str(chosen),
                    best=str(timed[0][1]),
                    best_ms=timed[0][0],
                    all=[(str(c), ms) for ms, c in timed],
                )
            )
            print(f"sweep {shape}: best {timed[0][1]} {timed[0][0]:.3f} ms; default {chosen}")
        ms = bench_graph(partial(fused_experts, x, w13, w2, weights, ids, out=out))
        eager_ms = bench(partial(fused_experts, x, w13, w2, weights, ids, out=out))
        loop_ms = bench(partial(torch_loop, x, w13, w2, weights, ids.long()))
        hit = ids.unique().numel()
        nbytes = hit * 3 * hidden * inter * 2 + tokens * hidden * 2 * 2
        flops = 2 * tokens * k * 3 * hidden * inter
        roof_ms = max(nbytes / copy_bw, flops / mm_rate) * 1e3
        rows.append(
            dict(
                op="fused_experts",
                shape=shape,
                experts_hit=hit,
                ms=ms,
                tb_s=nbytes / ms / 1e9,
                tflops=flops / ms / 1e9,
                eager_ms=eager_ms,
                pct_roofline=100 * roof_ms / ms,
                base="torch loop",
                base_ms=loop_ms,
                x_base=loop_ms / ms,
                max_rel_err=err,
            )
        )
    for tokens in (64, 4096):
        logits = torch.randn(tokens, 128, **BF16)
        ms = bench_graph(partial(topk_softmax, logits, 8, True))
        base = bench(partial(topk_softmax_ref, logits, 8, True))
        rows.append(
            dict(
                op="topk_softmax",
                shape=f"E=128 k=8 T={tokens}",
                ms=ms,
                base="torch",
                base_ms=base,
                x_base=base / ms,
            )
        )
        logits = torch.randn(tokens, 256, **BF16)
        bias = torch.randn(256, device=DEV) * 0.1
        kw = dict(num_groups=8, topk_groups=4, bias=bias, scaling=2.5)
        ms = bench_graph(partial(grouped_topk, logits, 8, **kw))
        base = bench(partial(grouped_topk_ref, logits, 8, GroupedRouting(8, 4, scaling=2.5), bias))
        rows.append(
            dict(
                op="grouped_topk",
                shape=f"E=256 k=8 g=8/4 T={tokens}",
                ms=ms,
                base="torch",
                base_ms=base,
                x_base=base / ms,
            )
        )
    record = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        triton=triton.__version__,
        copy_tb_s=copy_bw / 1e12,
        bf16_mm_tflops=mm_rate / 1e12,
        rows=rows,
        sweeps=sweeps,
    )
    print(f"\n{record['device']}  copy {copy_bw / 1e12:.2f} TB/s  bf16 matmul {mm_rate / 1e12:.0f} TFLOP/s")
    print(
        f"{'op':14} {'shape':26} {'hit':>4} {'ms':>8} {'TB/s':>6} {'TFLOP/s':>8} {'% roof':>7} {'eager':>7} "
        f"{'base ms':>8} {'x base':>7}"
    )
    for r in rows:
        extra = (
            f"{r['experts_hit']:4d} {r['ms']:8.3f} {r['tb_s']:6.2f} {r['tflops']:8.1f} {r['pct_roofline']:6.1f}% {r['eager_ms']:7.3f}"
            if r["op"] == "fused_experts"
            else f"{'':4} {r['ms']:8.3f} {'':6} {'':8} {'':7} {'':7}"
        )
        print(f"{r['op']:14} {r['shape']:26} {extra} {r['base_ms']:8.3f} {r['x_base']:7.2f}")
    return record


if __name__ == "__main__":
    main()
