"""Compile the paged-decode tile kernel for sm90 without a GPU and print its instruction mix.

  python -m benchmarks run compile_decode_sm90

Triton compiles to PTX and SASS on any machine (ptxas and cuobjdump ship in its wheel), so how loads
vectorize and where fp8 is converted can be checked before spending GPU time: per variant, the count of
SASS instructions, 16-byte async copies (cp.async.cg), narrower ones (cp.async.ca), one-byte shared loads
e4m3 conversions and stores to shared memory (the generic kernel's fp8 V makes a second pass through
shared memory; the Gluon kernel of decode_e4m3.py makes none). Arguments are specialized as at the B=64 Hq32/Hkv8/D128 page-16 benchmark shape.
"""

from __future__ import annotations

import re
from functools import partial

from benchmarks.harness.offline_compile import e4m3_decode_build, sass_lines, tile_decode_build


def main() -> dict:
    variants = [
        ("flash bf16", 0, "bf16", 0, False, 3),
        ("shuffle bf16", 1, "bf16", 0, False, 3),
        ("flash fp8, V converted after the MMA read", 0, "fp8e4nv", 1, False, 5),
        ("flash fp8, V as words (generic kernel)", 0, "fp8e4nv", 1, True, 5),
        ("shuffle fp8", 1, "fp8e4nv", 1, False, 5),
    ]
    kernels = [(label, partial(tile_decode_build, *args)) for label, *args in variants] + [
        ("flash fp8, Gluon e4m3 kernel (64 pos., 1 warp)", partial(e4m3_decode_build, BLOCK_N=64)),
        ("flash fp8, Gluon e4m3 kernel (default tiles)", e4m3_decode_build),
    ]
    columns = ("sass", "cp16", "cp_narrow", "lds_b8", "cvt_e4m3", "st_shared")
    rows = []
    print(f"{'variant':<48}{'SASS':>6}{'cp16':>6}{'cp<16':>7}{'lds.b8':>8}{'cvt e4m3':>9}{'st.shared':>10}")
    for label, build in kernels:
        kernel = build()
        ptx = kernel.asm["ptx"]
        counts = [len(sass_lines(kernel))] + [
            len(re.findall(p, ptx))
            for p in (
                r"cp\.async\.cg",
                r"cp\.async\.ca",
                r"ld\.shared\.b8",
                r"cvt\.rn\.f16x2\.e4m3x2",
                r"st\.shared",
            )
        ]
        print(f"{label:<48}" + "".join(f"{c:>{w}}" for c, w in zip(counts, (6, 6, 7, 8, 9, 10), strict=True)))
        rows.append({"variant": label, **dict(zip(columns, counts, strict=True))})
    return {"arch": "sm_90", "rows": rows}


if __name__ == "__main__":
    main()
