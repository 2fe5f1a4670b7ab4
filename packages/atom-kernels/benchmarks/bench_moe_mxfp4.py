"""Fused MoE with MXFP4 experts (GPT-OSS's checkpoints) against the same experts in bf16, same run.

  python -m benchmarks run moe_mxfp4

GPT-OSS's expert shapes (hidden = intermediate = 2880, top-4; 32 experts for gpt-oss-20b, 128 for
gpt-oss-120b) with its biases and clamped SwiGLU; the MXFP4 experts are the bf16 ones quantized by
atom-kernels' quantizer and run weight-only (each tile unpacked in registers). Median device time of
CUDA-graph replays; GB/s counts the bytes a step must read: the hit experts' MXFP4 bytes, scales and biases,
plus x and out, against a copy bandwidth measured in this run. A table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import torch
import triton

from atom_kernels import fused_experts
from atom_kernels.moe import ExpertActivation, ExpertBiases, ExpertMxfp4, quantize_mxfp4
from benchmarks.harness.ceilings import measure_ceilings

DEV = torch.device("cuda")
SHAPES = [("gpt-oss-20b", 32, 4, 2880, 2880), ("gpt-oss-120b", 128, 4, 2880, 2880)]
TOKENS = [1, 2, 4, 8, 16, 32, 64, 512]
SWIGLU = ExpertActivation("swiglu_oai", alpha=1.702, limit=7.0)


def _quantized(w: torch.Tensor, chunk: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_mxfp4 a few experts at a time: its fp32 temporaries for all 128 of gpt-oss-120b's experts
    at once would not fit beside the weights."""
    parts = [quantize_mxfp4(w[e : e + chunk]) for e in range(0, w.shape[0], chunk)]
    return torch.cat([b for b, _ in parts]), torch.cat([s for _, s in parts])


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    args = parser.parse_args()
    copy_bw, _ = measure_ceilings()
    rows = []
    for name, experts, k, hidden, inter in SHAPES:
        torch.manual_seed(0)
        w13 = (torch.randn(experts, 2 * inter, hidden, device=DEV) / hidden**0.5).to(torch.bfloat16)
        w2 = (torch.randn(experts, hidden, inter, device=DEV) / inter**0.5).to(torch.bfloat16)
        biases = ExpertBiases(
            torch.randn(experts, 2 * inter, device=DEV, dtype=torch.bfloat16) * 0.1,
            torch.randn(experts, hidden, device=DEV, dtype=torch.bfloat16) * 0.1,
        )
        (q13, s13), (q2, s2) = _quantized(w13), _quantized(w2)
        mxfp4 = ExpertMxfp4(s13, s2)
        d13, d2 = mxfp4.dequantize(q13, q2, torch.bfloat16)
        del w13, w2  # the bf16 baseline runs the dequantized weights: the same experts
        common = dict(activation=SWIGLU, biases=biases)
        for tokens in args.tokens:
            x = torch.randn(tokens, hidden, device=DEV, dtype=torch.bfloat16)
            ids = torch.rand(tokens, experts, device=DEV).topk(k, dim=-1).indices.to(torch.int32)
            weights = torch.softmax(torch.randn(tokens, k, device=DEV), dim=-1)
            out = torch.empty_like(x)
            ref = fused_experts(x, d13, d2, weights, ids, **common)
            got = fused_experts(x, q13, q2, weights, ids, mxfp4=mxfp4, out=out, **common)
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            assert err < 2e-2, f"{name} T={tokens}: MXFP4 experts differ from bf16 by {err:.3g} (relative)"
            bf16_ms = triton.testing.do_bench_cudagraph(
                partial(fused_experts, x, d13, d2, weights, ids, out=out, **common),
                rep=100,
                return_mode="median",
            )
            mxfp4_ms = triton.testing.do_bench_cudagraph(
                partial(fused_experts, x, q13, q2, weights, ids, mxfp4=mxfp4, out=out, **common),
                rep=100,
                return_mode="median",
            )
            hit = ids.unique().numel()
            values = 3 * hidden * inter  # per expert
            bias_bytes = hit * (2 * inter + hidden) * 2
            mxfp4_bytes = hit * (values // 2 + values // 32) + bias_bytes + tokens * hidden * 2 * 2
            bf16_bytes = hit * values * 2 + bias_bytes + tokens * hidden * 2 * 2
            flops = 2 * tokens * k * values
            row = dict(
                shape=name,
                tokens=tokens,
                experts_hit=hit,
                bf16_ms=bf16_ms,
                mxfp4_ms=mxfp4_ms,
                speedup=bf16_ms / mxfp4_ms,
                mxfp4_gb_s=mxfp4_bytes / mxfp4_ms / 1e6,
                mxfp4_pct_copy=100 * mxfp4_bytes / (mxfp4_ms * 1e-3) / copy_bw,
                bf16_pct_copy=100 * bf16_bytes / (bf16_ms * 1e-3) / copy_bw,
                mxfp4_tflops=flops / mxfp4_ms / 1e9,
                rel_err_vs_bf16=err,
            )
            rows.append(row)
            print(row, flush=True)
        del q13, q2, d13, d2, mxfp4, biases  # before the next shape's experts are made
        torch.cuda.empty_cache()
    print(f"\ncopy bandwidth {copy_bw / 1e12:.2f} TB/s")
    print(
        "| shape | T | experts hit | bf16 ms | MXFP4 ms | MXFP4 / bf16 speed | MXFP4 GB/s (% of copy) | TFLOP/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['shape']} | {r['tokens']} | {r['experts_hit']} | {r['bf16_ms']:.3f} | {r['mxfp4_ms']:.3f} | "
            f"{r['speedup']:.2f}x | {r['mxfp4_gb_s']:.0f} ({r['mxfp4_pct_copy']:.0f}%) | {r['mxfp4_tflops']:.0f} |"
        )
    return dict(
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(),
        copy_tb_s=copy_bw / 1e12,
        rows=rows,
    )


if __name__ == "__main__":
    main()
