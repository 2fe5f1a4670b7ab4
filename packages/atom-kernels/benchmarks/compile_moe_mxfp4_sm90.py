"""Compile the MXFP4 expert GEMM for sm90 without a GPU and print registers, spills and shared memory.

  python -m benchmarks run compile_moe_mxfp4_sm90

The gate/up (GATED, with GPT-OSS's biases and clamped SwiGLU) and down GEMMs over MXFP4 bytes at the tile
shapes fused_experts picks for decode and prefill, bf16 activations: whether unpacking the e2m1 tile in
registers spills, and whether the product still runs as warpgroup MMAs.
"""

from __future__ import annotations

import re

from atom_kernels.moe.expert_gemm import Activations, Epilogue, ExpertWeights, PairRows, _expert_gemm_kernel
from benchmarks.harness.offline_compile import build as offline_build
from benchmarks.harness.offline_compile import cuobjdump

DOT = True  # the scaled-dot path bf16 activations take
K = 2880  # GPT-OSS's hidden and intermediate sizes: k-steps of 128 end in a masked partial step
TILES = [  # block_m, block_n, block_k, num_warps, num_stages: what fused_experts picks for MXFP4 experts
    (16, 32, 256, 4, 3),  # decode, one token (mxfp4_tile_config)
    (16, 64, 128, 4, 3),  # decode, more tokens
    (32, 64, 128, 8, 4),
    (64, 64, 64, 8, 4),
    (128, 64, 32, 8, 3),
    (16, 64, 128, 8, 4),  # the 8-warp decode tile before them, and the bf16 tiles' shapes, for comparison
    (128, 64, 64, 8, 3),
    (128, 128, 64, 8, 3),
]


def build(tile, gated: bool):
    block_m, block_n, block_k, warps, stages = tile
    const = dict(SCALE_N=1, SCALE_K=32, GATED=gated, WEIGHTED=not gated, HAS_BIAS=True, ACT=1 if gated else 0)
    const |= dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, FP8_W=False, FP8_A=False)
    const |= dict(
        MXFP4_W=True, PAIR_TILES=False, PDL=False, A_BY_TOKEN=gated, EVEN_K=K % block_k == 0, W_K=block_k // 2
    )
    const |= dict(PRECISION="tf32", MXFP4_DOT=DOT, A_FORMAT="bf16")
    types = dict(
        act=Activations("*bf16", "*bf16", "i32", "i32"),
        wts=ExpertWeights("*u8", "*u8", "i64", "i32", "i64", "i32"),
        pairs=PairRows("*i32", "*i32", "*i32", "*fp32", "i32", "i32"),
        epi=Epilogue("*bf16", "i32", "fp32", "fp32"),
        out_ptr="*bf16",
        stride_om="i32",
        N="i32",
        K="i32",
    )
    return offline_build(_expert_gemm_kernel, types, const, num_warps=warps, num_stages=stages)


def main() -> dict:
    rows = []
    print(f"{'variant':<40}{'regs':>5}{'stack':>6}{'smem KB':>8}{'wgmma':>6}{'mma':>5}{'LDL':>5}")
    for tile in TILES:
        for gated in (True, False):
            kernel = build(tile, gated)
            usage, sass, ptx = cuobjdump(kernel, "-res-usage"), cuobjdump(kernel, "-sass"), kernel.asm["ptx"]
            regs, stack = re.search(r"REG:(\d+)", usage).group(1), re.search(r"STACK:(\d+)", usage).group(1)
            wgmma, mma = (len(re.findall(p, ptx)) for p in (r"wgmma\.mma_async", r"mma\.sync"))
            ldl = len(re.findall(r"\bLDL", sass))
            label = f"{'gate_up' if gated else 'down'} {tile}"
            print(
                f"{label:<40}{regs:>5}{stack:>6}{kernel.metadata.shared / 1024:8.0f}{wgmma:>6}{mma:>5}{ldl:>5}"
            )
            rows.append(dict(variant=label, regs=int(regs), stack=int(stack), wgmma=wgmma, mma=mma, ldl=ldl))
    return {"arch": "sm_90", "rows": rows}


if __name__ == "__main__":
    main()
