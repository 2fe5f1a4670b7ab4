"""fp8_linear (block (128, 128) e4m3 weight, bf16 x) against bf16 cuBLAS (F.linear), as graph replays.

  python -m benchmarks run fp8_linear -- [--rows 1 16 4096] [names...]

Llama-3-8B's projections and DeepSeek-V3's attention projections, from decode's single row to prefill's
16384. At 1..16 rows fp8_linear reads the weight once (the W8A8 skinny kernel, or the weight-only GEMV for
one row of a small weight), so its roofline is the bytes read (e4m3 weight + fp32 scales + bf16 x) at the
copy bandwidth measured in the same run; up to 64 rows the W8A8 skinny kernel; beyond, a W8A8 GEMM
(cuBLAS's blockwise-scaled one on Hopper, else the Triton kernel), whose ceiling is the tensor cores' rate
(x's quantization is timed with each). triton ms: the Triton W8A8 GEMM on the same rows, in the same run,
where fp8_linear takes cuBLAS; cublas ms: at 17..64 rows, where the skinny kernel runs, cuBLAS's whole
path (x's quantization and the blockwise GEMM) on the same rows, for where the two should meet. rel err:
against the fp32 reference of the path taken (the table in results/ from before the rel err reference
followed quantizes_input shows the W8A8 rows' error against the weight-only reference: ~2.5e-2, e4m3's
rounding of x). Weights rotate over copies that exceed the L2, as in a decode step where every layer's
weights stream.
"""

from __future__ import annotations

import argparse
import datetime
import math

import torch
import torch.nn.functional as F
import triton

from atom_kernels.activation import silu_and_mul
from atom_kernels.fp8 import fp8_linear, fp8_linear_ref, quantize_act, quantize_weight_ref
from atom_kernels.fp8.cublas_blockwise import ROW_ALIGN, blockwise_mm, cublas_blockwise_supported, cublas_w8a8
from atom_kernels.fp8.gemm import w8a8_gemm
from atom_kernels.fp8.linear import quantizes_input
from atom_kernels.fp8.skinny_w8a8 import MAX_ROWS as SKINNY_W8A8_MAX_ROWS
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.fp8_shapes import SHAPES
from benchmarks.harness.graph_timing import graph_ms, rotation

GATED = ("llama3-8b/down",)  # also timed from the MLP's gate_up, the activation fused into x's quantization
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384)
BLOCK = (128, 128)
CHECK_ROWS = (
    4096  # the fp32 reference is checked up to this many rows (beyond, it costs more than the timing)
)


def bench_shape(name: str, n: int, k: int, rows_list: list[int], copy_bw: float) -> list[dict]:
    w = torch.randn(n, k, device="cuda") / k**0.5
    q, s = quantize_weight_ref(w, BLOCK)
    w = w.to(torch.bfloat16)
    fp8_bytes = q.numel() + s.numel() * 4
    # Independent copies so consecutive calls miss the L2; x is one tensor (small where bandwidth matters).
    fp8_weights = [(q.clone(), s.clone()) for _ in range(rotation(fp8_bytes))]
    bf16_weights = [w.clone() for _ in range(rotation(w.numel() * 2))]
    out = []
    for rows in rows_list:
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        fp8_ms = graph_ms([lambda qc=qc, sc=sc, x=x: fp8_linear(x, qc, sc, BLOCK) for qc, sc in fp8_weights])
        bf16_ms = graph_ms([lambda wc=wc, x=x: F.linear(x, wc) for wc in bf16_weights])
        triton_ms = gemm_ms = gated_fp8_ms = gated_bf16_ms = cublas_ms = math.nan
        cublas_runs = cublas_blockwise_supported(n, k, BLOCK, x.dtype, x.device)
        on_cublas = rows > SKINNY_W8A8_MAX_ROWS and cublas_runs
        if cublas_runs and 16 < rows <= SKINNY_W8A8_MAX_ROWS:  # the skinny kernel's rows: cuBLAS beside it
            cublas_ms = graph_ms([lambda qc=qc, sc=sc, x=x: cublas_w8a8(x, qc, sc) for qc, sc in fp8_weights])
        if on_cublas:

            def triton_gemm(qc, sc, x=x):
                xq, xs = quantize_act(x, BLOCK[1])
                return w8a8_gemm(xq, xs, qc, sc, BLOCK, out_dtype=x.dtype)

            triton_ms = graph_ms([lambda qc=qc, sc=sc: triton_gemm(qc, sc) for qc, sc in fp8_weights])
            # cuBLAS's GEMM alone, x quantized once outside the graph: the GEMM's own rate against bf16's
            xq, xs = quantize_act(x, BLOCK[1], token_major_scales=True, pad_rows_to=ROW_ALIGN)
            gemm_ms = graph_ms(
                [
                    lambda qc=qc, sc=sc, xq=xq, xs=xs: blockwise_mm(xq, xs, qc, sc, torch.bfloat16)
                    for qc, sc in fp8_weights
                ]
            )
        if name in GATED:  # the MLP's down projection: bf16 runs silu_and_mul then the GEMM
            gate_up = torch.randn(rows, 2 * k, device="cuda", dtype=torch.bfloat16)
            gated_fp8_ms = graph_ms(
                [
                    lambda qc=qc, sc=sc, gate_up=gate_up: fp8_linear(gate_up, qc, sc, BLOCK, gated_input=True)
                    for qc, sc in fp8_weights
                ]
            )
            gated_bf16_ms = graph_ms(
                [lambda wc=wc, gate_up=gate_up: F.linear(silu_and_mul(gate_up), wc) for wc in bf16_weights]
            )
            del gate_up
        flop = 2 * rows * n * k
        nbytes = fp8_bytes + x.numel() * x.element_size()
        err = math.nan
        if rows <= CHECK_ROWS:  # against the fp32 reference of the path taken (W8A8 or weight-only)
            w8a8 = quantizes_input(rows, *q.shape, BLOCK[1])
            want = fp8_linear_ref(x, q, s, BLOCK, quantize_input=w8a8).float()
            err = ((fp8_linear(x, q, s, BLOCK).float() - want).abs().max() / want.abs().max()).item()
        out.append(
            dict(
                name=name,
                n=n,
                k=k,
                rows=rows,
                fp8_ms=fp8_ms,
                bf16_ms=bf16_ms,
                path="cublas" if on_cublas else "triton",
                triton_ms=triton_ms,
                cublas_path_ms=cublas_ms,
                cublas_gemm_only_ms=gemm_ms,
                cublas_gemm_only_x_bf16=bf16_ms / gemm_ms,
                gated_fp8_ms=gated_fp8_ms,
                gated_bf16_ms=gated_bf16_ms,
                gated_speedup=gated_bf16_ms / gated_fp8_ms,
                fp8_tflops=flop / (fp8_ms * 1e-3) / 1e12,
                bf16_tflops=flop / (bf16_ms * 1e-3) / 1e12,
                speedup=bf16_ms / fp8_ms,
                fp8_gb_s=nbytes / (fp8_ms * 1e-3) / 1e9,
                fp8_pct_copy=nbytes / (fp8_ms * 1e-3) / copy_bw * 100,
                max_rel_err=err,
            )
        )
        r = out[-1]
        print(
            f"{name:18} {rows:6} {fp8_ms:9.4f} {bf16_ms:9.4f} {r['fp8_tflops']:8.1f} {r['bf16_tflops']:8.1f} "
            f"{r['speedup']:6.2f} {r['fp8_gb_s']:8.0f} {r['fp8_pct_copy']:6.1f} {err:9.1e} {triton_ms:9.4f} {cublas_ms:9.4f} {bf16_ms / gemm_ms:7.2f} "
            f"{gated_bf16_ms / gated_fp8_ms:7.2f}",
            flush=True,
        )
        del x
    del fp8_weights, bf16_weights
    torch.cuda.empty_cache()
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    parser.add_argument("names", nargs="*", default=list(SHAPES))
    args = parser.parse_args()
    copy_bw, mm_flops = measure_ceilings()
    torch.manual_seed(0)
    print(
        f"{torch.cuda.get_device_name()}  copy {copy_bw / 1e12:.2f} TB/s (read + write), "
        f"bf16 8192^3 matmul {mm_flops / 1e12:.0f} TFLOP/s"
    )
    print(
        f"{'shape':18} {'M':>6} {'fp8 ms':>9} {'bf16 ms':>9} {'fp8 TF/s':>8} {'bf16 TF':>8} {'x':>6} "
        f"{'fp8 GB/s':>8} {'% copy':>6} {'rel err':>9} {'triton ms':>9} {'cublas ms':>9} {'gemm x':>7} {'gated x':>7}"
    )
    rows_out = []
    for name in args.names:
        rows_out += bench_shape(name, *SHAPES[name], args.rows, copy_bw)
    print(
        "x: bf16 ms / fp8 ms. fp8 GB/s: (e4m3 weight + fp32 scales + bf16 x) bytes / time. gemm x: bf16 over "
        "cuBLAS's blockwise GEMM alone (x quantized outside). gated x: the down projection from gate_up, "
        "bf16 silu_and_mul + GEMM over fp8_linear(gated_input=True)."
    )
    return dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        triton=triton.__version__,
        block=list(BLOCK),
        copy_tb_s=copy_bw / 1e12,
        bf16_mm_tflops=mm_flops / 1e12,
        rows=rows_out,
    )


if __name__ == "__main__":
    main()
