"""keyed_draw's kernels compile for sm_90 (to a cubin, with the ptxas in Triton's wheel; no GPU needed).
The interpreter runs the kernels' Python, not Triton's compiler: 64-bit key arithmetic, the while loop
of _finish and the scalar branches are checked by the compiler here, for bf16 logits as the engine
passes them. In a subprocess, outside the interpreter."""

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from atom_kernels.sampling.keyed_draw import CHUNK, _check_draw, _chunk_mass, _chunk_max, _finish

I64 = ("rows_ptr", "keys_ptr", "lag_ptr", "out_ptr")
I32 = ("done_ptr", "round_ptr")
F64 = ("total0_ptr", "temp_ptr", "top_p_ptr", "min_p_ptr")  # the engine's parameters come as float64

def cubin_bytes(kernel, consts):
    names = kernel.arg_names
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in consts:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            kind = ("*bf16" if name == "logits_ptr" else "*i64" if name in I64 else "*i32" if name in I32
                    else "*fp64" if name in F64 else "*fp32")
            signature[name], attrs[(i,)] = kind, [["tt.divisibility", 16]]
        else:
            signature[name] = "i32"
    unknown = [n for n in names if n.isupper() and n not in consts]
    if unknown:
        raise SystemExit(f"constexprs unknown to the test: {unknown}")
    src = ASTSource(kernel, signature, {(names.index(k),): v for k, v in consts.items()}, attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
    return len(compiled.asm["cubin"])

chunks = dict(CHUNK=CHUNK, BLOCK_C=64, USE_KTH=True)
lagged = dict(chunks, HAS_LAG=True)
print(json.dumps({
    "chunk_max": cubin_bytes(_chunk_max, dict(CHUNK=CHUNK)),
    "chunk_mass": cubin_bytes(_chunk_mass, chunks),
    "chunk_mass_no_kth": cubin_bytes(_chunk_mass, dict(chunks, USE_KTH=False)),
    "check_draw_first": cubin_bytes(_check_draw, dict(lagged, FIRST=True)),
    "check_draw": cubin_bytes(_check_draw, dict(lagged, FIRST=False)),
    "check_draw_unlagged": cubin_bytes(_check_draw, dict(chunks, HAS_LAG=False, FIRST=False)),
    "finish": cubin_bytes(_finish, lagged),
}))
"""


def test_keyed_draw_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(sizes) == {
        "chunk_max",
        "chunk_mass",
        "chunk_mass_no_kth",
        "check_draw_first",
        "check_draw",
        "check_draw_unlagged",
        "finish",
    }
    assert all(size > 0 for size in sizes.values())
