"""Kernels compiled for an NVIDIA target on any machine: Triton ships ptxas and cuobjdump in its wheel.

So how loads vectorize, where fp8 is converted or whether a tile spills can be read from PTX and SASS
before spending GPU time, and the CPU tests can check the instruction mix a Gluon kernel exists for.
`build` takes each runtime argument's type (a NamedTuple of types for a pack) and the constexprs; the
`*_build` functions give the kernels' builds at the shapes their benchmarks and tests read.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction


def _jit_function(kernel):
    """The JIT function under launch wrappers (@triton.heuristics, @triton.autotune)."""
    while not isinstance(kernel, triton.runtime.JITFunction):
        kernel = kernel.fn
    return kernel


def build(
    kernel,
    types: dict[str, object],
    constants: dict[str, object],
    *,
    divisible: tuple[str, ...] = (),
    arch: int = 90,
    **options,
):
    """kernel compiled for sm_<arch>. types: every runtime argument's Triton type ("*bf16", "i32", "fp32"),
    or a NamedTuple of them for a pack; constants: every constexpr, derived ones included (a launch
    wrapper's heuristics do not run here). Pointers are taken 16-byte aligned, and the integers named in
    `divisible` ("name", or "pack.field" in a pack) divisible by 16, as Triton specializes them at launch.
    options: num_warps, num_stages, ..."""
    fn = _jit_function(kernel)
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constants:
            signature[name] = "constexpr"
            continue
        ty = types[name]
        signature[name] = ty
        fields = ty._fields if isinstance(ty, tuple) else (None,)
        for j, (field, t) in enumerate(zip(fields, ty if isinstance(ty, tuple) else (ty,), strict=True)):
            label = name if field is None else f"{name}.{field}"
            if t.startswith("*") or label in divisible:
                attrs[(i,) if field is None else (i, j)] = [["tt.divisibility", 16]]
    constexprs = {(fn.arg_names.index(k),): v for k, v in constants.items()}
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    src = source(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def cuobjdump(compiled, flag: str) -> str:
    """cuobjdump's output for a compiled kernel's cubin (flag: -sass, -res-usage, ...)."""
    from triton.backends.nvidia import compiler as nvidia

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    out = subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    return out


def sass_lines(compiled) -> list[str]:
    """The instruction lines of a compiled kernel's SASS."""
    return [
        line for line in cuobjdump(compiled, "-sass").splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)
    ]


def _attention_types(q: str, cache: str) -> dict[str, object]:
    """The packs' types as at the B=64 Hq32/Hkv8/D128 page-16 decode benchmark (a contiguous flash cache)."""
    from atom_kernels.attention.packs import PagedKV, Partials, QueryRows, Scoring

    return dict(
        rows=QueryRows(f"*{q}", f"*{q}", "i32", "i32", "i32", "i32"),
        kv=PagedKV(
            f"*{cache}", f"*{cache}", "*fp32", "*fp32", "*i32", "i32", "i32", "i32", "i32", "i32", "i32"
        ),
        scores=Scoring("fp32", "fp32", "i32", "*fp32"),
        parts=Partials("*fp32", "*fp32"),
        seq_lens_ptr="*i32",
        cu_q_ptr="*i32",
        num_q_heads="i32",
    )


# Integers of that shape divisible by 16 (the cache strides are 0 there: a contiguous layout).
_ATTENTION_DIVISIBLE = ("rows.stride_qt", "rows.stride_qh", "rows.stride_ot", "rows.stride_oh")
_ATTENTION_DIVISIBLE += ("kv.stride_bt", "kv.block_size", "num_q_heads")


def tile_decode_build(layout: int, cache: str, scale_kind: int, v_words: bool, stages: int):
    """attention/tile_kernel.paged_attention_kernel at that decode shape (GROUP 4, one token a sequence)."""
    from atom_kernels.attention.packs import KVFormat
    from atom_kernels.attention.tile_kernel import paged_attention_kernel

    fp8 = cache.startswith("fp8")
    constants = dict(
        FMT=KVFormat(layout, 16 if fp8 else 8, v_words, scale_kind),
        GROUP=4,
        NUM_SPLITS=1,
        HAS_SINKS=False,
        HEAD_DIM=128,
        BLOCK_M=16,
        BLOCK_N=64,
        PDL=False,
        TOKENS=4,
        HAS_SOFTCAP=False,
        HAS_WINDOW=False,
        DOT_PRECISION="tf32",
        FP16_COMPUTE=fp8,
        BLOCK_D=128,
    )
    types = _attention_types("bf16", cache)
    return build(
        paged_attention_kernel,
        types,
        constants,
        divisible=_ATTENTION_DIVISIBLE,
        num_warps=2,
        num_stages=stages,
    )


def e4m3_decode_build(**constants):
    """attention/decode_e4m3.e4m3_decode_kernel at that decode shape; constants override its constexprs
    (defaults: GROUP 4, one split, per-tensor scales, no features, D 128, 32 positions, 3 stages, pages
    of 16)."""
    from atom_kernels.attention.decode_e4m3 import e4m3_decode_kernel

    group = constants.get("GROUP", 4)
    defaults = dict(
        GROUP=group,
        NUM_SPLITS=1,
        SCALE_KIND=1,
        HAS_SINKS=False,
        HEAD_DIM=128,
        BLOCK_N=32,
        STAGES=3,
        PAGE=16,
        TOKENS=16 // group,
        HAS_SOFTCAP=False,
        HAS_WINDOW=False,
    )
    types = _attention_types("bf16", "fp8e4nv")
    divisible = tuple(f"rows.stride_{s}" for s in ("qt", "qh", "ot", "oh"))
    divisible += tuple(f"kv.stride_{s}" for s in ("bt", "cb", "cn", "ch"))
    return build(e4m3_decode_kernel, types, defaults | constants, divisible=divisible, num_warps=1)


def e4m3_shuffle_write_build(**constants):
    """cache/write_shuffle_e4m3.e4m3_shuffle_write_kernel with bf16 inputs, int64 slots and 16-divisible
    strides; constants override its constexprs (defaults: D 128, per-tensor scales, pages of 16)."""
    from atom_kernels.cache.packs import CacheSlots, NewRows
    from atom_kernels.cache.write_shuffle_e4m3 import e4m3_shuffle_write_kernel

    types = dict(
        src=NewRows("*bf16", "*bf16", "i32", "i32", "i32", "i32", "i32"),
        dst=CacheSlots("*fp8e4nv", "*fp8e4nv", "*i64", "*fp32", "*fp32", "i32", "i32"),
    )
    divisible = ("src.stride_kt", "src.stride_kh", "src.stride_vt", "src.stride_vh", "dst.num_heads")
    divisible += ("dst.block_size",)
    defaults = dict(HEAD_DIM=128, SCALE_KIND=1, FP8_MAX=448.0, PAGE=16)
    return build(e4m3_shuffle_write_kernel, types, defaults | constants, divisible=divisible, num_warps=1)
