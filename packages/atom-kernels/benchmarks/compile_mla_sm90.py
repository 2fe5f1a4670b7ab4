"""Compile the MLA decode kernels for sm90 without a GPU and print registers, spills and shared memory.

  python -m benchmarks run compile_mla_sm90

Triton builds PTX and SASS on any machine (ptxas and cuobjdump ship in its wheel), so whether a tile
spills, pipelines its row loads (cp.async) or uses warpgroup MMAs can be read before spending GPU time.
Per variant (both loops of mla/attention.py, DeepSeek's 512 + 64 latent): registers a thread, spill stack
bytes, shared memory, wgmma / mma.sync counts in the PTX, 16-byte async copies, local loads in SASS.
"""

from __future__ import annotations

import re

from atom_kernels.attention.packs import Partials, QueryRows
from atom_kernels.mla.attention import LatentCache, MlaTiles, _mla_kernel
from benchmarks.harness.offline_compile import build as offline_build
from benchmarks.harness.offline_compile import cuobjdump

VARIANTS = [  # tiles, cache dtype
    (MlaTiles(64, 64, 8, 1), "bf16"),
    (MlaTiles(64, 64, 8, 2), "bf16"),
    (MlaTiles(16, 128, 8, 2), "bf16"),
    (MlaTiles(16, 64, 4, 2, heads_as_n=True), "bf16"),
    (MlaTiles(16, 64, 8, 2, heads_as_n=True), "bf16"),
    (MlaTiles(32, 64, 8, 2, heads_as_n=True), "bf16"),
    (MlaTiles(64, 64, 8, 1), "fp8e4nv"),
    (MlaTiles(16, 64, 4, 2, heads_as_n=True), "fp8e4nv"),
]


def build(tiles: MlaTiles, cache: str):
    fp8 = cache.startswith("fp8")
    const = dict(RANK=512, ROPE=64, HAS_SCALE=fp8, BLOCK_H=tiles.block_h, BLOCK_N=tiles.block_n)
    const |= dict(
        HEADS_AS_N=tiles.heads_as_n, COMPUTE_F16=tiles.heads_as_n and fp8, PRECISION="tf32", PDL=True
    )
    types = dict(
        rows=QueryRows("*bf16", "*bf16", "i32", "i32", "i32", "i32"),
        latent=LatentCache(f"*{cache}", "*fp32", "*i32", "i32", "i32"),
        parts=Partials("*fp32", "*fp32"),
        seq_lens_ptr="*i32",
        cu_q_ptr="*i32",
        sm_scale_log2="fp32",
    )
    types |= dict.fromkeys(("num_heads", "max_q", "num_splits"), "i32")
    return offline_build(_mla_kernel, types, const, num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def main() -> dict:
    rows = []
    print(f"{'variant':<72}{'regs':>5}{'stack':>6}{'smem KB':>8}{'wgmma':>6}{'mma':>5}{'cp16':>5}{'LDL':>5}")
    for tiles, cache in VARIANTS:
        kernel = build(tiles, cache)
        usage, sass, ptx = cuobjdump(kernel, "-res-usage"), cuobjdump(kernel, "-sass"), kernel.asm["ptx"]
        regs, stack = re.search(r"REG:(\d+)", usage).group(1), re.search(r"STACK:(\d+)", usage).group(1)
        counts = [len(re.findall(p, ptx)) for p in (r"wgmma\.mma_async", r"mma\.sync", r"cp\.async\.cg")]
        counts.append(len(re.findall(r"\bLDL", sass)))
        label = f"{tiles} {cache}"
        print(
            f"{label:<72}{regs:>5}{stack:>6}{kernel.metadata.shared / 1024:8.0f}"
            + "".join(f"{c:>{w}}" for c, w in zip(counts, (6, 5, 5, 5), strict=True))
        )
        wgmma, mma, cp16, ldl = counts
        rows.append(
            dict(variant=label, regs=int(regs), stack=int(stack), smem_kb=kernel.metadata.shared / 1024)
            | dict(wgmma=wgmma, mma=mma, cp16=cp16, ldl=ldl)
        )
    return {"arch": "sm_90", "rows": rows}


if __name__ == "__main__":
    main()
