"""Fused MoE with block-quantized fp8 experts against its bf16 path, same data, same run (H200).

  python -m benchmarks run moe_fp8

The fp8 experts are the bf16 ones quantized in [128, 128] blocks, run two ways: W8A8 (fused_experts'
default: x and the intermediate quantized per row and 128-group, e4m3 tiles into the MMA) and weight-only
(quantize_input=False: each weight tile dequantized as it is loaded). Median device time of CUDA-graph
replays; GB/s counts the expert weights hit (and their scales) plus x and out, against a copy bandwidth
measured in this run. A table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import torch
import triton

from atom_kernels import fused_experts
from atom_kernels.fp8.ref import quantize_weight_ref
from atom_kernels.moe import ExpertScales
from benchmarks.harness.ceilings import measure_ceilings

DEV = torch.device("cuda")
BLOCK = (128, 128)
SHAPES = [("Qwen3-30B-A3B", 128, 8, 2048, 768), ("DeepSeek-V3", 256, 8, 7168, 2048)]
TOKENS = [1, 8, 64, 512, 4096]


def quantized(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    qs, ss = zip(*(quantize_weight_ref(w[e], BLOCK) for e in range(w.shape[0])), strict=True)
    return torch.stack(qs), torch.stack(ss)


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    copy_bw, _ = measure_ceilings()
    rows = []
    for name, experts, k, hidden, inter in SHAPES:
        torch.manual_seed(0)
        w13 = (torch.randn(experts, 2 * inter, hidden, device=DEV) / hidden**0.5).to(torch.bfloat16)
        w2 = (torch.randn(experts, hidden, inter, device=DEV) / inter**0.5).to(torch.bfloat16)
        q13, s13 = quantized(w13)
        q2, s2 = quantized(w2)
        scales = ExpertScales(s13, s2, BLOCK)
        for tokens in TOKENS:
            x = torch.randn(tokens, hidden, device=DEV, dtype=torch.bfloat16)
            ids = torch.rand(tokens, experts, device=DEV).topk(k, dim=-1).indices.to(torch.int32)
            weights = torch.softmax(torch.randn(tokens, k, device=DEV), dim=-1)
            out = torch.empty_like(x)
            ref = fused_experts(x, w13, w2, weights, ids)
            got = fused_experts(x, q13, q2, weights, ids, scales=scales, out=out)
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            assert err < 0.1, f"{name} T={tokens}: fp8 experts differ from bf16 by {err:.3g} (relative)"
            weight_only_ms = triton.testing.do_bench_cudagraph(
                partial(
                    fused_experts, x, q13, q2, weights, ids, scales=scales, quantize_input=False, out=out
                ),
                rep=100,
                return_mode="median",
            )
            bf16_ms = triton.testing.do_bench_cudagraph(
                partial(fused_experts, x, w13, w2, weights, ids, out=out), rep=100, return_mode="median"
            )
            fp8_ms = triton.testing.do_bench_cudagraph(
                partial(fused_experts, x, q13, q2, weights, ids, scales=scales, out=out),
                rep=100,
                return_mode="median",
            )
            hit = ids.unique().numel()
            weights_fp8 = hit * 3 * hidden * inter + (s13[0].numel() + s2[0].numel()) * 4 * hit
            io = tokens * hidden * 2 * 2
            flops = 2 * tokens * k * 3 * hidden * inter
            row = dict(
                shape=name,
                tokens=tokens,
                experts_hit=hit,
                bf16_ms=bf16_ms,
                fp8_ms=fp8_ms,
                speedup=bf16_ms / fp8_ms,
                weight_only_ms=weight_only_ms,
                weight_only_speedup=bf16_ms / weight_only_ms,
                fp8_gb_s=(weights_fp8 + io) / fp8_ms / 1e6,
                fp8_pct_copy=100 * (weights_fp8 + io) / (fp8_ms * 1e-3) / copy_bw,
                bf16_gb_s=(2 * hit * 3 * hidden * inter + io) / bf16_ms / 1e6,
                fp8_tflops=flops / fp8_ms / 1e9,
                bf16_tflops=flops / bf16_ms / 1e9,
                rel_err_vs_bf16=err,
            )
            rows.append(row)
            print(row, flush=True)
    print(f"\ncopy bandwidth {copy_bw / 1e12:.2f} TB/s")
    print(
        "| shape | T | experts hit | bf16 ms | W8A8 ms | W8A8 / bf16 speed | weight-only / bf16 speed "
        "| W8A8 GB/s (% of copy) | W8A8 TFLOP/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['shape']} | {r['tokens']} | {r['experts_hit']} | {r['bf16_ms']:.3f} | {r['fp8_ms']:.3f} | "
            f"{r['speedup']:.2f}x | {r['weight_only_speedup']:.2f}x | {r['fp8_gb_s']:.0f} "
            f"({r['fp8_pct_copy']:.0f}%) | {r['fp8_tflops']:.0f} |"
        )
    return dict(
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(),
        copy_tb_s=copy_bw / 1e12,
        rows=rows,
    )


if __name__ == "__main__":
    main()
