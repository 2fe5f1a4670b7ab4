"""keyed_draw's kernels compile for sm_90 (to a cubin, with the ptxas in Triton's wheel; no GPU needed).
The interpreter runs the kernels' Python, not Triton's compiler: 64-bit key arithmetic, the while loop
of _finish and the scalar branches are checked by the compiler here, for bf16 logits as the engine
passes them. In a subprocess, outside the interpreter."""

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, os.environ["ATOM_KERNELS_DIR"])  # the offline compile tools live with the benchmarks
from benchmarks.harness.offline_compile import build
from atom_kernels.sampling.keyed_draw import (
    CHUNK, DrawnRows, RoundState, RowParams, _check_draw, _chunk_mass, _chunk_max, _finish,
)

# bf16 logits as the engine passes them, its parameters as float64
TYPES = dict(
    src=DrawnRows("*bf16", "*i64", "i32", "i32", "i32"),
    per_row=RowParams("*fp64", "*fp32", "*fp64", "*fp64", "*i64", "*i64", "i32"),
    state=RoundState("*fp32", "*i32", "*i32", "*fp64", "*fp32", "*fp32"),
    out_ptr="*i64",
    out_rows="i32",
)

def cubin_bytes(kernel, consts):
    return len(build(kernel, TYPES, consts, num_warps=8).asm["cubin"])

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
    env["ATOM_KERNELS_DIR"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
