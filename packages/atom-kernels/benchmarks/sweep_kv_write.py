"""Tile sweeps for the KV writes on the GPU: the shuffle layout's (write_shuffle.py) heads per program x
warps, and the flash layout's (write.py) warps for bf16 and both fp8 scale kinds.

  PYTHONPATH=packages/atom-kernels/src python3 packages/atom-kernels/benchmarks/sweep_kv_write.py
T=16k Hkv8 D128, page 16, a prefill's slots (consecutive offsets through random pages); CUDA-graph timing
as in bench_paged_attention.py. Prints each configuration's time and % of the copy bandwidth.
"""

from __future__ import annotations

import itertools
from functools import partial

import torch
import triton
from bench_paged_attention import HKV, D, write_case, write_slots
from ceilings import measure_ceilings
from graph_timing import graph_ms

from atom_kernels.cache import KVLayout
from atom_kernels.cache.fp8 import fp8_max
from atom_kernels.cache.layout import cache_strides, shuffle_width
from atom_kernels.cache.write import _write_flash_kernel
from atom_kernels.cache.write_shuffle import write_shuffle_kernel


def main():
    torch.manual_seed(0)
    copy_bw, _ = measure_ceilings()
    tokens, block_size = 16384, 16
    num_blocks = tokens // block_size * 2
    slots = write_slots("pages", tokens, num_blocks, block_size)
    for kind in ("bf16", "tensor", "token"):
        fp8 = None if kind == "bf16" else kind
        k, v, kc, vc, ks, vs = write_case(KVLayout.SHUFFLE, fp8, tokens, num_blocks, block_size)
        dtype = kc.dtype
        x = shuffle_width(dtype)
        scales = (ks, vs) if fp8 else (k, v)
        moved = 2 * k.numel() * (2 + kc.element_size()) + (2 * tokens * HKV * 4 if kind == "token" else 0)
        results = []
        for block_h, warps in itertools.product((1, 2, 4, 8), (1, 2, 4, 8)):
            launch = partial(
                write_shuffle_kernel[(triton.cdiv(tokens, x), triton.cdiv(HKV, block_h))],
                k, v, kc, vc, slots, *scales, tokens, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                HKV, block_size, HEAD_DIM=D, X=x, SCALE_KIND={"bf16": 0, "tensor": 1, "token": 2}[kind],
                FP8_MAX=fp8_max(dtype) if fp8 else 1.0, BLOCK_H=block_h, BLOCK_D=D, num_warps=warps,
            )  # fmt: skip
            ms = graph_ms([launch])
            results.append((ms, block_h, warps))
        print(f"\nshuffle KV write {kind}, T={tokens} pages")
        for ms, block_h, warps in sorted(results):
            print(
                f"  {ms:7.4f} ms  {100 * moved / copy_bw / (ms * 1e-3):5.1f}% of copy  heads={block_h} warps={warps}"
            )

    sweep_flash(copy_bw, tokens, num_blocks, block_size, slots)


def sweep_flash(copy_bw, tokens, num_blocks, block_size, slots):
    """One token per program, all heads (8 x 128): warps per program."""
    for kind in ("bf16", "tensor", "token"):
        fp8 = None if kind == "bf16" else kind
        k, v, kc, vc, ks, vs = write_case(KVLayout.FLASH, fp8, tokens, num_blocks, block_size)
        scales = (ks, vs) if fp8 else (k, v)
        moved = 2 * k.numel() * (2 + kc.element_size()) + (2 * tokens * HKV * 4 if kind == "token" else 0)
        results = []
        for warps in (1, 2, 4, 8):
            launch = partial(
                _write_flash_kernel[(tokens, 1)],
                k, v, kc, vc, slots, *scales, k.stride(0), k.stride(1), v.stride(0), v.stride(1), HKV, D,
                block_size, *cache_strides(KVLayout.FLASH, kc), LAYOUT=0,
                SCALE_KIND={"bf16": 0, "tensor": 1, "token": 2}[kind],
                FP8_MAX=fp8_max(kc.dtype) if fp8 else 1.0, BLOCK_H=HKV, BLOCK_D=D, num_warps=warps,
            )  # fmt: skip
            results.append((graph_ms([launch]), warps))
        print(f"\nflash KV write {kind}, T={tokens} pages")
        for ms, warps in sorted(results):
            print(f"  {ms:7.4f} ms  {100 * moved / copy_bw / (ms * 1e-3):5.1f}% of copy  warps={warps}")


if __name__ == "__main__":
    main()
