"""Compile the paged-decode tile kernel for sm90 without a GPU and print its instruction mix.

  PYTHONPATH=packages/atom-kernels/src python3 packages/atom-kernels/benchmarks/compile_decode_sm90.py

Triton compiles to PTX and SASS on any machine (ptxas and cuobjdump ship in its wheel), so how loads
vectorize and where fp8 is converted can be checked before spending GPU time: per variant, the count of
SASS instructions, 16-byte async copies (cp.async.cg), narrower ones (cp.async.ca), one-byte shared loads
e4m3 conversions and stores to shared memory (the generic kernel's fp8 V makes a second pass through
shared memory; the Gluon kernel of decode_e4m3.py makes none). Arguments are specialized as at the B=64 Hq32/Hkv8/D128 page-16 benchmark shape.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from functools import partial

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import compiler as nvidia
from triton.compiler import ASTSource

from atom_kernels.attention.decode_e4m3 import compile_offline as compile_e4m3
from atom_kernels.attention.kernels import paged_attention_kernel

INTS = dict(
    stride_qt=4096,
    stride_qh=128,
    stride_ot=4096,
    stride_oh=128,
    stride_bt=512,
    num_q_heads=32,
    num_kv_heads=8,
    block_size=16,
    stride_cb=0,
    stride_cn=0,
    stride_ch=0,
    window=0,
)


def compile_decode(layout: int, kv: str, scale_kind: int, v_words: bool, stages: int):
    fp8 = kv.startswith("fp8")
    const = dict(
        GROUP=4,
        TOKENS=4,
        NUM_SPLITS=1,
        LAYOUT=layout,
        X=16 if fp8 else 8,
        V_WORDS=v_words,
        SCALE_KIND=scale_kind,
        HAS_SOFTCAP=False,
        HAS_WINDOW=False,
        HAS_SINKS=False,
        DOT_PRECISION="tf32",
        FP16_COMPUTE=fp8,
        HEAD_DIM=128,
        BLOCK_M=16,
        BLOCK_N=64,
        BLOCK_D=128,
        PDL=False,
    )
    ptrs = dict(
        q_ptr="*bf16",
        k_cache_ptr=f"*{kv}",
        v_cache_ptr=f"*{kv}",
        out_ptr="*bf16",
        part_o_ptr="*fp32",
        part_lse_ptr="*fp32",
        k_scale_ptr="*fp32",
        v_scale_ptr="*fp32",
        sinks_ptr="*fp32",
        block_tables_ptr="*i32",
        seq_lens_ptr="*i32",
        cu_q_ptr="*i32",
    )
    names = paged_attention_kernel.arg_names
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in const:
            signature[name] = "constexpr"
        elif name in ptrs:
            signature[name], attrs[(i,)] = ptrs[name], [["tt.divisibility", 16]]
        elif name in ("sm_scale", "softcap"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if INTS[name] and INTS[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(
        paged_attention_kernel, signature, {(names.index(k),): v for k, v in const.items()}, attrs
    )
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=2, num_stages=stages))


def sass_lines(kernel) -> list[str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    return [line for line in out.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]


def main() -> None:
    variants = [
        ("flash bf16", 0, "bf16", 0, False, 3),
        ("shuffle bf16", 1, "bf16", 0, False, 3),
        ("flash fp8, V converted after the MMA read", 0, "fp8e4nv", 1, False, 5),
        ("flash fp8, V as words (generic kernel)", 0, "fp8e4nv", 1, True, 5),
        ("shuffle fp8", 1, "fp8e4nv", 1, False, 5),
    ]
    kernels = [(label, partial(compile_decode, *args)) for label, *args in variants] + [
        ("flash fp8, Gluon e4m3 kernel (64 pos., 1 warp)", partial(compile_e4m3, BLOCK_N=64)),
        ("flash fp8, Gluon e4m3 kernel (default tiles)", compile_e4m3),
    ]
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


if __name__ == "__main__":
    main()
