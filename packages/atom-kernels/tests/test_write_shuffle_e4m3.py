"""The Gluon e4m3 shuffle-layout KV write: against the torch reference on an NVIDIA sm_89+ GPU (Gluon has
no interpreter), and on any machine its sm90 build, read for what the kernel exists for."""

import json
import os
import re
import sys

import pytest
import torch

from atom_kernels.cache import KVLayout, kv_cache_shapes, write_kv
from atom_kernels.cache.ref import write_kv_ref
from atom_kernels.cache.write_shuffle_e4m3 import e4m3_shuffle_write_supported

GPU = torch.cuda.is_available() and torch.version.hip is None and torch.cuda.get_device_capability() >= (8, 9)
DEVICE = "cuda" if GPU else "cpu"
on_gpu = pytest.mark.gpu(
    min_capability=(8, 9),
    nvidia=True,
    reason="Gluon kernels run on an NVIDIA sm_89+ GPU only (no interpreter)",
)
FP8 = torch.float8_e4m3fn
HEADS = 4


def _sequences(block_size, lengths_and_starts, pages):
    """A prefill's slots: each sequence fills consecutive offsets of its pages (popped from `pages`),
    starting where its cached prefix ended."""
    out = []
    for length, start in lengths_and_starts:
        positions = torch.arange(start, start + length)
        table = torch.tensor([pages.pop() for _ in range(-(-(start + length) // block_size))])
        out.append(table[positions // block_size] * block_size + positions % block_size)
    return torch.cat(out)


def _slots(pattern, block_size, num_blocks):
    pages = torch.randperm(num_blocks).tolist()
    # Sequences start mid-run in the batch and in their pages, end mid-run, and one is shorter than a run.
    prefill = [(19, 0), (21, 7), (40, 19), (16, 0), (5, 11), (33, block_size)]
    if pattern == "prefill":
        slots = _sequences(block_size, prefill, pages)
    elif pattern == "decode":  # scattered single tokens: every run incomplete
        slots = torch.tensor(pages[:13]) * block_size + torch.randint(0, block_size, (13,))
    elif pattern == "padded":  # -1 inside runs, and a CUDA graph's trailing padding
        slots = _sequences(block_size, prefill, pages)
        slots[[3, 40, 41, 77]] = -1
        slots = torch.cat([slots, torch.full((21,), -1)])
    else:  # "mixed": decodes first, then prefills, as engines order a batch
        decode = torch.tensor(pages[-5:]) * block_size + 3
        slots = torch.cat([decode, _sequences(block_size, prefill[:4], pages[:-5])])
    return slots.to(DEVICE)


def _caches(block_size, num_blocks, head_dim, per_token):
    shapes = kv_cache_shapes(KVLayout.SHUFFLE, num_blocks, block_size, HEADS, head_dim, FP8)
    kc, vc = (torch.full(shape, float("nan"), device=DEVICE, dtype=FP8) for shape in shapes)
    if per_token:
        scales = [torch.zeros(num_blocks, HEADS, block_size, device=DEVICE) for _ in range(2)]
    else:
        scales = [torch.tensor([s], device=DEVICE) for s in (0.02, 0.03)]
    return kc, vc, scales


def _assert_same_writes(got: torch.Tensor, want: torch.Tensor):
    """Exactly the reference's elements written (NaN poison elsewhere untouched), equal up to a rare
    rounding step: the kernel multiplies by the scale's approximate reciprocal where the reference divides."""
    got, want = got.float(), want.float()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "a written or poisoned element differs"
    differ = (got != want) & ~torch.isnan(want)
    assert differ.float().mean().item() < 1e-3, f"{differ.float().mean().item():.2%} of elements differ"
    step = want.abs() / 8 + 2.0**-9  # one e4m3 step (3 mantissa bits; subnormal spacing 2^-9)
    assert ((got - want).abs() <= step)[differ].all()


def _write_and_check(k, v, slots, block_size, num_blocks, per_token):
    kc, vc, scales = _caches(block_size, num_blocks, k.shape[-1], per_token)
    assert e4m3_shuffle_write_supported(k, kc)  # the Gluon kernel, not the generic one
    kc_ref, vc_ref, ref_scales = kc.clone(), vc.clone(), [s.clone() for s in scales]
    write_kv(k, v, kc, vc, slots, layout="shuffle", k_scale=scales[0], v_scale=scales[1], backend="triton")
    write_kv_ref(k, v, kc_ref, vc_ref, slots, "shuffle", *ref_scales)
    for got, want in zip(scales, ref_scales, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    _assert_same_writes(kc, kc_ref)
    _assert_same_writes(vc, vc_ref)


@on_gpu
@pytest.mark.parametrize("pattern", ["prefill", "decode", "padded", "mixed"])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("block_size", [16, 48, 64])  # 48: a page size that is not a power of two
@pytest.mark.parametrize("head_dim", [64, 128])
def test_equals_reference(pattern, per_token, block_size, head_dim):
    num_blocks = 40
    slots = _slots(pattern, block_size, num_blocks)
    k = (torch.randn(slots.numel(), HEADS, head_dim, device=DEVICE) * 3).to(torch.bfloat16)
    v = (torch.randn(slots.numel(), HEADS, head_dim, device=DEVICE) * 3).to(torch.bfloat16)
    v[1, 2] = 0.0  # an all-zero row: its per-token scale is 1
    _write_and_check(k, v, slots, block_size, num_blocks, per_token)


@on_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_strided_inputs(dtype):
    """Token K/V as views of wider rows (a fused QKV projection's output), in other float dtypes."""
    num_blocks, block_size, head_dim = 40, 16, 128
    slots = _slots("prefill", block_size, num_blocks)
    qkv = torch.randn(slots.numel(), HEADS, 3 * head_dim, device=DEVICE).to(dtype)
    _write_and_check(
        qkv[..., head_dim : 2 * head_dim], qkv[..., 2 * head_dim :], slots, block_size, num_blocks, True
    )


@on_gpu
def test_offsets_past_2_pow_31_bytes():
    num_blocks, block_size, head_dim = 280_000, 16, 128  # 2.3 GB per e4m3 cache (4 heads)
    kc, vc, scales = _caches(block_size, num_blocks, head_dim, per_token=False)
    assert kc.numel() > 2**31
    slots = torch.arange(16, device=DEVICE) + (num_blocks - 1) * block_size  # a whole run in the last page
    k = torch.randn(16, HEADS, head_dim, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    write_kv(k, v, kc, vc, slots, layout="shuffle", k_scale=scales[0], v_scale=scales[1], backend="triton")
    got_k = kc[-1].permute(2, 0, 1, 3).reshape(16, HEADS, head_dim)  # [Hkv, D/16, B, 16] -> [B, Hkv, D]
    got_v = vc[-1, :, 0].permute(2, 0, 1)  # [Hkv, D, 16] -> [B, Hkv, D]
    # one rounding step apart at most (the kernel multiplies by the scale's reciprocal)
    torch.testing.assert_close(got_k.float(), (k.float() / 0.02).to(FP8).float(), rtol=0.13, atol=2.0**-9)
    torch.testing.assert_close(got_v.float(), (v.float() / 0.03).to(FP8).float(), rtol=0.13, atol=2.0**-9)


def test_other_caches_take_the_generic_kernel():
    shapes = kv_cache_shapes(KVLayout.SHUFFLE, 2, 16, 2, 128, torch.bfloat16)
    k = torch.randn(3, 2, 128, device=DEVICE)
    assert not e4m3_shuffle_write_supported(k, torch.empty(shapes[0], device=DEVICE, dtype=torch.bfloat16))
    assert e4m3_shuffle_write_supported(k, torch.empty(shapes[0], device=DEVICE, dtype=FP8)) == GPU
    assert not e4m3_shuffle_write_supported(k[..., :96], torch.empty(shapes[0], device=DEVICE, dtype=FP8))


# Offline sm90 builds: this file run as a script (conftest.offline_builds says why in a fresh interpreter).
BUILDS = [(128, 1), (128, 2), (64, 1), (64, 2)]  # (head_dim, scale_kind)


def _offline_builds(out_path: str) -> None:
    # The offline compile tools live with the benchmarks, in this package's folder.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.harness.offline_compile import e4m3_shuffle_write_build

    ptx = {f"{d} {s}": e4m3_shuffle_write_build(HEAD_DIM=d, SCALE_KIND=s).asm["ptx"] for d, s in BUILDS}
    with open(out_path, "w") as f:
        json.dump(ptx, f)


@pytest.fixture(scope="module")
def offline(offline_builds):
    return offline_builds(__file__)


@pytest.mark.parametrize(("head_dim", "scale_kind"), BUILDS)
def test_sm90_build_transposes_in_registers(offline, head_dim, scale_kind):
    """What the kernel exists for, read from its sm90 PTX (compiled without a GPU): V's transpose into
    16-byte runs is a renaming of registers, so no tile passes through shared memory (per-token scales
    broadcast their 16 maxima, 64 bytes); no spills; every K row and V run stored by one 16-byte store; each
    element converted once per path (K, the V run, loose tokens' V)."""
    ptx = offline[f"{head_dim} {scale_kind}"]
    shared_read = 16 * len(re.findall(r"ld\.shared\.v4\.b32", ptx))
    assert len(re.findall(r"ld\.shared", ptx)) == shared_read // 16  # nothing narrower
    assert shared_read == (64 if scale_kind == 2 else 0)
    assert len(re.findall(r"st\.shared", ptx)) == (1 if scale_kind == 2 else 0)
    assert ".local" not in ptx
    per_thread = 16 * head_dim // 32  # elements of a 16-token tile per thread
    assert len(re.findall(r"st\.global\.v4\.b32", ptx)) == 2 * per_thread // 16  # K rows + V runs
    assert len(re.findall(r"st\.global\.b8", ptx)) == per_thread  # loose tokens' V, byte by byte
    assert len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)) == 3 * per_thread // 2
    if head_dim == 128:
        # 16-byte loads: K rows, loose tokens' V rows (and per-token scales' V rows); 8-byte: V tiles of 4
        # dims per token, the own tokens' and a run's reaching into the next program's
        rows = 3 if scale_kind == 2 else 2
        assert len(re.findall(r"ld\.global(\.nc)?\.v4\.b32", ptx)) == rows * per_thread // 8
        assert len(re.findall(r"ld\.global(\.nc)?\.v2\.b32", ptx)) == 2 * 16


if __name__ == "__main__":
    _offline_builds(sys.argv[1])
