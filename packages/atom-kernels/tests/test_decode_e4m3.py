"""The Gluon e4m3 decode kernel (flash layout): against the float64 reference on an NVIDIA sm_89+ GPU
(Gluon has no interpreter), and on any machine its sm90 build, read for what the kernel exists for."""

import json
import os
import re
import sys

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from atom_kernels.attention import decode_e4m3, paged_decode
from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.decode import decode_kernel, decode_tiles
from atom_kernels.attention.decode_e4m3 import e4m3_decode_supported
from atom_kernels.attention.launch import AttentionKernel, run_paged_attention
from atom_kernels.cache import KVLayout

GPU = torch.cuda.is_available() and torch.version.hip is None and torch.cuda.get_device_capability() >= (8, 9)
DEVICE = "cuda" if GPU else "cpu"
on_gpu = pytest.mark.gpu(
    min_capability=(8, 9),
    nvidia=True,
    reason="Gluon kernels run on an NVIDIA sm_89+ GPU only (no interpreter)",
)
TOL = 2e-2  # bf16 q and output


def _case(paged_case, *, seq_lens, query_len=1, heads=(32, 8), head_dim=128, block_size=16, scales="tensor"):
    return paged_case(
        seq_lens=seq_lens,
        query_lens=[query_len] * len(seq_lens),
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=head_dim,
        block_size=block_size,
        layout=KVLayout.FLASH,
        dtype=torch.bfloat16,
        cache_dtype=torch.float8_e4m3fn,
        fp8_scales=scales,
        device=DEVICE,
    )


def _decode_and_check(case, query_len=1, num_splits=None, **kw):
    assert e4m3_decode_supported(case.q, case.k_cache, case.v_cache)  # the Gluon kernel, not the fallback
    out = paged_decode(
        case.q,
        case.k_cache,
        case.v_cache,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        query_len=query_len,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        num_splits=num_splits,
        out=torch.full_like(case.q, float("nan")),
        backend="triton",
        **kw,
    )
    assert not torch.isnan(out).any(), "an output element was not written, or a poisoned KV entry was read"
    want = case.reference(**kw)
    torch.testing.assert_close(out.float(), want.float(), rtol=TOL, atol=TOL)


@on_gpu
@pytest.mark.parametrize("scales", ["tensor", "token"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize(
    ("heads", "head_dim"), [((8, 8), 128), ((32, 8), 128), ((16, 2), 64), ((16, 1), 128)]
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_ragged_batch(paged_case, scales, block_size, heads, head_dim, num_splits):
    # lengths off every tile and page boundary, one shorter than a tile, one of a single token
    case = _case(
        paged_case,
        seq_lens=[1, 17, 64, 130, 333, 1000],
        heads=heads,
        head_dim=head_dim,
        block_size=block_size,
        scales=scales,
    )
    _decode_and_check(case, num_splits=num_splits)


@on_gpu
@pytest.mark.parametrize(
    "features",
    [
        {},
        {"sliding_window": 12},
        {"softcap": 5.0},
        {"sinks": True},
        {"sliding_window": 40, "softcap": 3.0, "sinks": True},
    ],
)
@pytest.mark.parametrize("heads", [(8, 2), (16, 2)])  # 4 tokens x 4 heads in one tile; 8 heads: two tiles
@pytest.mark.parametrize("num_splits", [1, 3])
def test_speculative_verify_window_softcap_sinks(paged_case, features, heads, num_splits):
    features = dict(features)
    case = _case(paged_case, seq_lens=[20, 67, 9, 300], query_len=3, heads=heads, scales="token")
    if features.pop("sinks", False):
        features["sinks"] = torch.randn(heads[0], device=DEVICE) * 2
    _decode_and_check(case, query_len=3, num_splits=num_splits, **features)


@on_gpu
def test_packed_k_and_v_views(paged_case):
    """vLLM's cache: K and V of a token-head side by side, V a view one head_dim past K."""
    case = _case(paged_case, seq_lens=[130, 7, 64], heads=(16, 4))
    n, p, h, d = case.k_cache.shape
    buf = torch.full((n, p, h, 2 * d), float("nan"), device=DEVICE).to(torch.float8_e4m3fn)
    buf[..., :d], buf[..., d:] = case.k_cache, case.v_cache
    _decode_and_check(type(case)(**{**vars(case), "k_cache": buf[..., :d], "v_cache": buf[..., d:]}))


def test_unsupported_inputs_take_the_generic_kernel(paged_case):
    case = _case(paged_case, seq_lens=[5], heads=(32, 8))
    q, kc, vc = case.q, case.k_cache, case.v_cache
    assert e4m3_decode_supported(q, kc, vc) == GPU
    assert not e4m3_decode_supported(q, kc.to(torch.bfloat16), vc.to(torch.bfloat16))  # not fp8
    assert not e4m3_decode_supported(q, kc[:, :, :1], vc[:, :, :1])  # 32 q-heads per KV head: two row tiles
    wide = _case(paged_case, seq_lens=[5], head_dim=256)
    assert not e4m3_decode_supported(wide.q, wide.k_cache, wide.v_cache)  # its swizzle is for 64 and 128 dims
    want = AttentionKernel.E4M3_GLUON if GPU else AttentionKernel.TILE
    assert decode_kernel(q, kc, vc, KVLayout.FLASH) is want
    assert decode_kernel(q, kc, vc, "flash") is want
    assert decode_kernel(wide.q, wide.k_cache, wide.v_cache, KVLayout.FLASH) is AttentionKernel.TILE


def test_e4m3_kernel_refuses_inputs_it_does_not_take(paged_case):
    """The kernel is run_paged_attention's argument; a call it cannot serve is an error, not a fallback."""
    case = _case(paged_case, seq_lens=[5], head_dim=256)  # D=256: the generic kernel's only
    with pytest.raises(ValueError, match="e4m3_gluon kernel needs"):
        run_paged_attention(
            PagedCall(case.q, case.k_cache, case.v_cache, **case.args()),
            max_query_len=1,
            backend="triton",
            num_splits=1,
            config=decode_tiles(case.k_cache.dtype, KVLayout.FLASH, AttentionKernel.E4M3_GLUON),
            kernel="e4m3_gluon",
        )


def _shared_bytes_read(ptx: str) -> int:
    widths = {"v4.b32": 16, "v2.b32": 8, "b32": 4, "v4.b16": 8, "v2.b16": 4, "b16": 2, "b8": 1, "u8": 1}
    return sum(widths[w] for w in re.findall(r"ld\.shared\.(v[24]\.b(?:32|16)|b32|b16|b8|u8)", ptx))


# Offline sm90 builds: this file run as a script (conftest.offline_builds says why in a fresh interpreter).
PTX_CASES = [(128, 16, 1), (128, 32, 2), (64, 32, 1)]  # (head_dim, block_n, scale_kind)
BANK_CASES = [(128, 16), (128, 32), (64, 32)]  # (head_dim, block_n)
STAGES = 3
_recorded = {}


@gluon.constexpr_function
def _record(key, value):
    _recorded[key] = value
    return value


@gluon.jit
def _bank_conflict_probe(BLOCK_N: gl.constexpr, D: gl.constexpr):
    """Records the extra shared-memory wavefronts of the kernel's K reads, V reads and cp.async writes of one
    ring slot."""
    smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_N, D], decode_e4m3.smem_layout(D))
    k_ty: gl.constexpr = gl.distributed_type(
        gl.float8e4nv, [BLOCK_N, D], decode_e4m3.k_read_layout(BLOCK_N, D)
    )
    v_ty: gl.constexpr = gl.distributed_type(
        gl.float8e4nv, [BLOCK_N, D], decode_e4m3.v_read_layout(BLOCK_N, D)
    )
    c_ty: gl.constexpr = gl.distributed_type(gl.float8e4nv, [BLOCK_N, D], decode_e4m3.copy_layout(D))
    _record(f"{D} {BLOCK_N} K", gl.bank_conflicts(k_ty, smem.type))
    _record(f"{D} {BLOCK_N} V", gl.bank_conflicts(v_ty, smem.type))
    _record(f"{D} {BLOCK_N} copy", gl.bank_conflicts(c_ty, smem.type))


def _offline_builds(out_path: str) -> None:
    # The offline compile tools live with the benchmarks, in this package's folder.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.harness.offline_compile import e4m3_decode_build

    # The probe reports through _record while it is compiled; a cached build would skip that and report nothing.
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    ptx = {
        f"{d} {n} {k}": e4m3_decode_build(HEAD_DIM=d, BLOCK_N=n, SCALE_KIND=k, STAGES=STAGES).asm["ptx"]
        for d, n, k in PTX_CASES
    }
    for d, n in BANK_CASES:
        src = GluonASTSource(
            _bank_conflict_probe, {"BLOCK_N": "constexpr", "D": "constexpr"}, {(0,): n, (1,): d}, {}
        )
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
    assert len(_recorded) == 3 * len(BANK_CASES), f"the bank-conflict probe recorded {sorted(_recorded)}"
    with open(out_path, "w") as f:
        json.dump({"ptx": ptx, "banks": _recorded}, f)


@pytest.fixture(scope="module")
def offline(offline_builds):
    return offline_builds(__file__)


@pytest.mark.parametrize(("head_dim", "block_n", "scale_kind"), PTX_CASES)
def test_sm90_build_reads_each_operand_byte_once(offline, head_dim, block_n, scale_kind):
    """What the kernel exists for, read from its sm90 PTX (compiled without a GPU): every K and V byte
    is copied into shared memory by a 16-byte cp.async, read back once by wide loads straight into MMA
    operands (per thread: 2 x BLOCK_N x D / 32 bytes per step), converted in registers, and never stored
    to shared memory again. Per-token scales ride the same ring (4-byte copies, 2 x BLOCK_N bytes read per
    thread and step). The compile itself checks that renumbering the dims moves no data."""
    ptx = offline["ptx"][f"{head_dim} {block_n} {scale_kind}"]
    kv_copies = len(re.findall(r"cp\.async\.cg\.shared\.global [^;]*, 0x10[,;]", ptx))
    scale_copies = len(re.findall(r"cp\.async\.ca\.shared\.global [^;]*, 0x4[,;]", ptx))
    assert kv_copies == STAGES * 2 * block_n * head_dim // (
        16 * 32
    )  # the prologue's STAGES - 1 tiles + the loop's
    assert scale_copies == (2 * STAGES if scale_kind == 2 else 0)
    assert len(re.findall(r"cp\.async\.c[ag]\.", ptx)) == kv_copies + scale_copies  # no copy of another width
    assert "st.shared" not in ptx
    assert ".local" not in ptx  # no register spills
    assert _shared_bytes_read(ptx) == 2 * block_n * head_dim // 32 + (2 * block_n if scale_kind == 2 else 0)
    assert len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", ptx)) == block_n * head_dim // 32
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16", ptx)) == 2 * block_n * head_dim // (8 * 16)


@pytest.mark.parametrize(("head_dim", "block_n"), BANK_CASES)
def test_ring_slot_bank_conflicts(offline, head_dim, block_n):
    """The swizzle serves the reads it was chosen for (decode_e4m3.smem_layout's docstring): none at D=128,
    one extra wavefront for V at D=64."""
    banks = offline["banks"]
    assert banks[f"{head_dim} {block_n} K"] == 0
    assert banks[f"{head_dim} {block_n} V"] == (1 if head_dim == 64 else 0)
    assert banks[f"{head_dim} {block_n} copy"] == 0


if __name__ == "__main__":
    _offline_builds(sys.argv[1])
