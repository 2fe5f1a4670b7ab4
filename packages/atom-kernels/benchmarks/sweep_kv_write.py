"""Tile sweep for the shuffle-layout KV write (write_shuffle.py) on the GPU: heads per program x warps.

  PYTHONPATH=packages/atom-kernels/src python3 packages/atom-kernels/benchmarks/sweep_kv_write.py
T=16k Hkv8 D128, page 16, a prefill's slots (consecutive offsets through random pages); CUDA-graph timing
as in bench_paged_attention.py. Prints each configuration's time and % of the copy bandwidth.
"""

from __future__ import annotations

import itertools
from functools import partial

import torch
import triton
from bench_paged_attention import DEV, HKV, D, write_case, write_slots
from ceilings import measure_ceilings
from graph_timing import graph_ms

from atom_kernels.cache import KVLayout
from atom_kernels.cache.fp8 import fp8_max
from atom_kernels.cache.layout import shuffle_width
from atom_kernels.cache.write_shuffle import write_shuffle_kernel


def main():
    torch.manual_seed(0)
    copy_bw, _ = measure_ceilings()
    tokens, block_size = 16384, 16
    num_blocks = tokens // block_size * 2
    slots = write_slots("pages", tokens, num_blocks, block_size)
    for kind in ("bf16", "fp8/tensor"):
        k, v, kc, vc, _, _ = write_case(KVLayout.SHUFFLE, "tensor" if kind != "bf16" else None, tokens, num_blocks,
                                        block_size)  # fmt: skip
        dtype = kc.dtype
        x = shuffle_width(dtype)
        scale = torch.tensor([0.01], device=DEV)
        moved = 2 * k.numel() * (2 + kc.element_size())
        results = []
        for block_h, warps in itertools.product((1, 2, 4, 8), (2, 4, 8)):
            launch = partial(
                write_shuffle_kernel[(triton.cdiv(tokens, x), triton.cdiv(HKV, block_h))],
                k, v, kc, vc, slots, scale, scale, tokens, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                HKV, block_size, HEAD_DIM=D, X=x, SCALE_KIND=1 if kind != "bf16" else 0,
                FP8_MAX=fp8_max(dtype) if kind != "bf16" else 1.0, BLOCK_H=block_h, BLOCK_D=D, num_warps=warps,
            )  # fmt: skip
            ms = graph_ms([launch])
            results.append((ms, block_h, warps))
        print(f"\nshuffle KV write {kind}, T={tokens} pages")
        for ms, block_h, warps in sorted(results):
            print(
                f"  {ms:7.4f} ms  {100 * moved / copy_bw / (ms * 1e-3):5.1f}% of copy  heads={block_h} warps={warps}"
            )


if __name__ == "__main__":
    main()
