"""Tile sweeps for the KV writes on the GPU: the shuffle layout's generic kernel (write_shuffle.py) heads per
program x warps, the flash layout's (write.py) warps for bf16 and both fp8 scale kinds, and the e4m3 shuffle
Gluon kernel's (write_shuffle_e4m3.py) register caps. Pass "e4m3" for the last one only.

  python -m benchmarks run sweep_kv_write
T=16k Hkv8 D128, page 16, a prefill's slots (consecutive offsets through random pages); CUDA-graph timing
as in bench_paged_attention.py. Prints each configuration's time and % of the copy bandwidth.
"""

from __future__ import annotations

import itertools
import sys
from functools import partial

import torch
import triton

from atom_kernels.cache import KVLayout
from atom_kernels.cache.fp8 import fp8_max
from atom_kernels.cache.layout import cache_strides
from atom_kernels.cache.packs import CacheSlots, new_rows
from atom_kernels.cache.write import _write_flash_kernel
from atom_kernels.cache.write_shuffle_e4m3 import e4m3_shuffle_write_kernel
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms
from benchmarks.harness.paged_cases import HKV, D, generic_shuffle_write, write_case, write_slots


def main():
    torch.manual_seed(0)
    copy_bw, _ = measure_ceilings()
    tokens, block_size = 16384, 16
    num_blocks = tokens // block_size * 2
    slots = write_slots("pages", tokens, num_blocks, block_size)
    if sys.argv[1:] == ["e4m3"]:
        sweep_e4m3_shuffle(copy_bw, tokens, num_blocks, block_size, slots)
        return
    for kind in ("bf16", "tensor", "token"):
        fp8 = None if kind == "bf16" else kind
        k, v, kc, vc, ks, vs = write_case(KVLayout.SHUFFLE, fp8, tokens, num_blocks, block_size)
        moved = 2 * k.numel() * (2 + kc.element_size()) + (2 * tokens * HKV * 4 if kind == "token" else 0)
        results = []
        for block_h, warps in itertools.product((1, 2, 4, 8), (1, 2, 4, 8)):
            launch = partial(generic_shuffle_write, k, v, kc, vc, slots, ks, vs, block_h, warps)
            ms = graph_ms([launch])
            results.append((ms, block_h, warps))
        print(f"\nshuffle KV write {kind}, T={tokens} pages")
        for ms, block_h, warps in sorted(results):
            print(
                f"  {ms:7.4f} ms  {100 * moved / copy_bw / (ms * 1e-3):5.1f}% of copy  heads={block_h} warps={warps}"
            )

    sweep_flash(copy_bw, tokens, num_blocks, block_size, slots)
    sweep_e4m3_shuffle(copy_bw, tokens, num_blocks, block_size, slots)


def sweep_flash(copy_bw, tokens, num_blocks, block_size, slots):
    """One token per program, all heads (8 x 128): warps per program."""
    for kind in ("bf16", "tensor", "token"):
        fp8 = None if kind == "bf16" else kind
        k, v, kc, vc, ks, vs = write_case(KVLayout.FLASH, fp8, tokens, num_blocks, block_size)
        scales = (ks, vs) if fp8 else (k, v)
        moved = 2 * k.numel() * (2 + kc.element_size()) + (2 * tokens * HKV * 4 if kind == "token" else 0)
        results = []
        for warps in (1, 2, 4, 8):
            dst = CacheSlots(kc, vc, slots, *scales, HKV, block_size)
            launch = partial(
                _write_flash_kernel[(tokens, 1)], new_rows(k, v), dst, D, *cache_strides(KVLayout.FLASH, kc),
                LAYOUT=0, SCALE_KIND={"bf16": 0, "tensor": 1, "token": 2}[kind],
                FP8_MAX=fp8_max(kc.dtype) if fp8 else 1.0, BLOCK_H=HKV, BLOCK_D=D, num_warps=warps,
            )  # fmt: skip
            results.append((graph_ms([launch]), warps))
        print(f"\nflash KV write {kind}, T={tokens} pages")
        for ms, warps in sorted(results):
            print(f"  {ms:7.4f} ms  {100 * moved / copy_bw / (ms * 1e-3):5.1f}% of copy  warps={warps}")


def sweep_e4m3_shuffle(copy_bw, tokens, num_blocks, block_size, slots):
    """The e4m3 shuffle write's Gluon kernel (write_shuffle_e4m3.py; one warp, 16 tokens x one head per
    program): register caps. Its occupancy is bound by registers (ncu: 16 / 12 one-warp programs per SM
    at 128 / 137 registers), its warps stall on memory."""
    for kind in ("tensor", "token"):
        k, v, kc, vc, ks, vs = write_case(KVLayout.SHUFFLE, kind, tokens, num_blocks, block_size)
        moved = 2 * k.numel() * (2 + kc.element_size()) + (2 * tokens * HKV * 4 if kind == "token" else 0)
        results = []
        for maxnreg in (None, 128, 120, 112, 96):
            caps = {} if maxnreg is None else {"maxnreg": maxnreg}
            launch = partial(
                e4m3_shuffle_write_kernel[(triton.cdiv(tokens, 16), HKV)], new_rows(k, v),
                CacheSlots(kc, vc, slots, ks, vs, HKV, block_size), HEAD_DIM=D,
                SCALE_KIND={"tensor": 1, "token": 2}[kind], FP8_MAX=fp8_max(kc.dtype), PAGE=block_size,
                num_warps=1, **caps,
            )  # fmt: skip
            results.append((graph_ms([launch]), maxnreg))
        print(f"\ne4m3 shuffle KV write (Gluon) {kind}, T={tokens} pages")
        for ms, maxnreg in sorted(results, key=lambda r: r[0]):
            print(f"  {ms:7.4f} ms  {100 * moved / copy_bw / (ms * 1e-3):5.1f}% of copy  maxnreg={maxnreg}")


if __name__ == "__main__":
    main()
