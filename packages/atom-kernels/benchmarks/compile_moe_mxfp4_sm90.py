"""Compile the MXFP4 expert GEMM for sm90 without a GPU and print registers, spills and shared memory, and
the instructions its k loop issues per weight value at one token's tile beside the GEMV's (mxfp4_gemv.py).

  python -m benchmarks run compile_moe_mxfp4_sm90

The gate/up (GATED, with GPT-OSS's biases and clamped SwiGLU) and down GEMMs over MXFP4 bytes at the tile
shapes fused_experts picks for decode and prefill, bf16 activations: whether unpacking the e2m1 tile in
registers spills, and whether the product still runs as warpgroup MMAs.
"""

from __future__ import annotations

import re

from atom_kernels.moe.expert_gemm import Activations, Epilogue, ExpertWeights, PairRows, _expert_gemm_kernel
from atom_kernels.moe.mxfp4_gemv import _mxfp4_gemv_kernel, gemv_config
from benchmarks.harness.offline_compile import build as offline_build
from benchmarks.harness.offline_compile import cuobjdump, sass_lines

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


def _types(weights: str) -> dict:
    """Both kernels' runtime arguments: bf16 activations, MXFP4 weights as `weights` ("*u8" bytes, or the
    GEMV's "*i32" words), uint8 scales."""
    return dict(
        act=Activations("*bf16", "*bf16", "i32", "i32"),
        wts=ExpertWeights(weights, "*u8", "i64", "i32", "i64", "i32"),
        pairs=PairRows("*i32", "*i32", "*i32", "*fp32", "i32", "i32"),
        epi=Epilogue("*bf16", "i32", "fp32", "fp32"),
        out_ptr="*bf16",
        stride_om="i32",
        N="i32",
        K="i32",
    )


def build(tile, gated: bool):
    block_m, block_n, block_k, warps, stages = tile
    const = dict(SCALE_N=1, SCALE_K=32, GATED=gated, WEIGHTED=not gated, HAS_BIAS=True, ACT=1 if gated else 0)
    const |= dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, FP8_W=False, FP8_A=False)
    const |= dict(
        MXFP4_W=True, PAIR_TILES=False, PDL=False, A_BY_TOKEN=gated, EVEN_K=K % block_k == 0, W_K=block_k // 2
    )
    const |= dict(PRECISION="tf32", MXFP4_DOT=DOT, A_FORMAT="bf16")
    return offline_build(_expert_gemm_kernel, _types("*u8"), const, num_warps=warps, num_stages=stages)


def build_gemv(gated: bool):
    """The GEMV at gemv_config's shape, specialized as Triton specializes it for gpt-oss's experts (K = N =
    2880): what is a multiple of 16 is marked so; a row's 360 int32 words and its 90 scales are not."""
    cfg = gemv_config()
    const = dict(GATED=gated, WEIGHTED=not gated, HAS_BIAS=True, ACT=1 if gated else 0)
    const |= dict(BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PTX=True)
    divisible = ("act.stride_am", "wts.stride_we", "wts.stride_se", "stride_om", "N", "K")
    return offline_build(
        _mxfp4_gemv_kernel, _types("*i32"), const, divisible=divisible, num_warps=cfg.num_warps
    )


def loop_instructions_per_value(kernel, values_per_step: int, threads: int) -> float:
    """SASS instructions between the k loop's head and its backward branch, per weight value a thread
    converts in one k-step."""
    lines = sass_lines(kernel)
    for line in lines:
        branch = re.search(r"BRA (0x[0-9a-f]+)", line)
        here = int(re.search(r"/\*([0-9a-f]+)\*/", line).group(1), 16)
        if branch and int(branch.group(1), 16) < here:  # the backward branch closes the k loop
            head = int(branch.group(1), 16)
            return sum(
                head <= int(re.search(r"/\*([0-9a-f]+)\*/", x).group(1), 16) <= here for x in lines
            ) / (values_per_step / threads)
    raise ValueError("no backward branch in the SASS")


def main() -> dict:
    rows = []
    cfg, (_, bn, bk, warps, _) = gemv_config(), TILES[0]
    per_value = dict(
        scaled_dot=loop_instructions_per_value(build(TILES[0], True), 2 * bn * bk, 32 * warps),
        gemv=loop_instructions_per_value(build_gemv(True), 2 * cfg.block_n * cfg.block_k, 32 * cfg.num_warps),
    )
    print(f"gate/up k loop, SASS instructions a weight value: {per_value}")
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
    return {"arch": "sm_90", "rows": rows, "gate_up_loop_instructions_per_value": per_value}


if __name__ == "__main__":
    main()
