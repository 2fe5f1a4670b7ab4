"""KV-cache writes: the reference against docs/architecture.md's offsets (§3), the Triton kernel against the reference."""

import pytest
import torch

from atom_kernels.cache import KVLayout, flash_to_shuffle, kv_cache_shapes, shuffle_width, to_flash, write_kv
from atom_kernels.cache.fp8 import default_fp8_dtype
from atom_kernels.cache.ref import read_kv_ref, write_kv_ref

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# The CPU interpreter's bf16 math and fp8 conversions are wrong: those run on the GPU only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
FP8 = default_fp8_dtype(torch.device(DEVICE))


def _case(layout, dtype, block_size, num_blocks=None, heads=2, head_dim=32, tokens=11):
    """Fresh random K/V, NaN-filled caches, and distinct random slots with -1 padding mixed in."""
    num_blocks = num_blocks or max(7, -(-3 * tokens // block_size))  # spare slots stay NaN
    k = torch.randn(tokens, heads, head_dim, device=DEVICE) * 2
    v = torch.randn(tokens, heads, head_dim, device=DEVICE) * 2
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:tokens]
    slots[torch.randperm(tokens, device=DEVICE)[:2]] = -1
    k_shape, v_shape = kv_cache_shapes(layout, num_blocks, block_size, heads, head_dim, dtype)
    nan = float("nan") if dtype.is_floating_point and dtype.itemsize > 1 else 0.0
    caches = (
        torch.full(k_shape, nan, device=DEVICE).to(dtype),
        torch.full(v_shape, nan, device=DEVICE).to(dtype),
    )
    return k.to(dtype) if dtype.itemsize > 1 else k, v.to(dtype) if dtype.itemsize > 1 else v, slots, caches


@pytest.mark.parametrize("layout", list(KVLayout))
def test_reference_write_lands_at_designs_element_offsets(layout):
    block_size, heads, head_dim = 16, 2, 32
    k, v, slots, (kc, vc) = _case(layout, torch.float16, block_size, heads=heads, head_dim=head_dim)
    write_kv_ref(k, v, kc, vc, slots, layout)
    x = shuffle_width(torch.float16)
    flat_k, flat_v = kc.reshape(-1), vc.reshape(-1)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        blk, off = divmod(s, block_size)
        for h in range(heads):
            for d in range(head_dim):
                if layout is KVLayout.FLASH:
                    ko = vo = ((blk * block_size + off) * heads + h) * head_dim + d
                else:
                    ko = ((blk * heads + h) * (head_dim // x) + d // x) * block_size * x + off * x + d % x
                    vo = ((blk * heads + h) * (block_size // x) + off // x) * head_dim * x + d * x + off % x
                assert flat_k[ko] == k[t, h, d] and flat_v[vo] == v[t, h, d]
    written = (slots >= 0).sum().item() * heads * head_dim
    assert (~torch.isnan(kc.float())).sum().item() == written  # nothing else was touched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("layout", "block_size"),
    [
        (KVLayout.FLASH, 1),
        (KVLayout.FLASH, 16),
        (KVLayout.FLASH, 64),
        (KVLayout.SHUFFLE, 16),
        (KVLayout.SHUFFLE, 64),
    ],
)
def test_triton_write_equals_reference(layout, block_size, dtype):
    k, v, slots, (kc, vc) = _case(layout, dtype, block_size)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv(k, v, kc, vc, slots, layout=layout, backend="triton")
    write_kv_ref(k, v, kc_ref, vc_ref, slots, layout)
    torch.testing.assert_close(kc, kc_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vc, vc_ref, rtol=0, atol=0, equal_nan=True)


def _prefill_slots(block_size, lengths_and_starts, num_blocks):
    """Slots as a prefill writes them: each sequence fills consecutive offsets of its (random) pages,
    starting where its cached prefix ended."""
    pages = torch.randperm(num_blocks).tolist()
    slots = []
    for length, start in lengths_and_starts:
        positions = torch.arange(start, start + length)
        table = torch.tensor([pages.pop() for _ in range(-(-(start + length) // block_size))])
        slots.append(table[positions // block_size] * block_size + positions % block_size)
    return torch.cat(slots).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # shuffle runs of x = 4 and 8
@pytest.mark.parametrize(("heads", "head_dim"), [(3, 32), (8, 256)])  # 8 x 256: two head blocks
@pytest.mark.parametrize("layout", list(KVLayout))
def test_prefill_page_runs_equal_reference(layout, heads, head_dim, dtype):
    """Groups of tokens whose slots run through whole pages, start mid-page (a cached prefix), or hold
    padding: the grouped shuffle stores must land exactly where the reference puts each token."""
    block_size, num_blocks = 16, 12
    # tokens 8-15 fill half a page from offset 0 (whole x-runs); 3, 20 and 40 are padding
    slots = _prefill_slots(block_size, [(16, 0), (37, 5), (9, 3)], num_blocks)
    slots[[3, 20, 40]] = -1
    tokens = slots.numel()
    k = torch.randn(tokens, heads, head_dim, device=DEVICE).to(dtype)
    v = torch.randn(tokens, heads, head_dim, device=DEVICE).to(dtype)
    shapes = kv_cache_shapes(layout, num_blocks, block_size, heads, head_dim, dtype)
    kc, vc = (torch.full(shape, float("nan"), device=DEVICE, dtype=dtype) for shape in shapes)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv(k, v, kc, vc, slots, layout=layout, backend="triton")
    write_kv_ref(k, v, kc_ref, vc_ref, slots, layout)
    torch.testing.assert_close(kc, kc_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vc, vc_ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("layout", list(KVLayout))
def test_strided_token_inputs(layout):
    base = torch.randn(9, 3, 2, 32, device=DEVICE)
    k, v = base[:, 0], base[:, 2]  # [T, Hkv, D] views with a token stride of 3*2*32
    slots = torch.randperm(4 * 16, device=DEVICE)[:9]
    shapes = kv_cache_shapes(layout, 4, 16, 2, 32, torch.float32)
    kc, vc = torch.zeros(shapes[0], device=DEVICE), torch.zeros(shapes[1], device=DEVICE)
    write_kv(k, v, kc, vc, slots, layout=layout, backend="triton")
    pages = torch.arange(4, device=DEVICE)
    got_k, got_v = read_kv_ref(kc, vc, pages, 64, layout)
    torch.testing.assert_close(got_k[slots], k)
    torch.testing.assert_close(got_v[slots], v)


def test_shuffle_is_a_permutation_of_flash():
    k, v, slots, (kc, vc) = _case(KVLayout.FLASH, torch.float16, 16)
    write_kv_ref(k, v, kc, vc, slots, KVLayout.FLASH)
    ks, vs = flash_to_shuffle(kc, vc)
    kf, vf = to_flash(KVLayout.SHUFFLE, ks, vs)
    torch.testing.assert_close(kf, kc, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vf, vc, rtol=0, atol=0, equal_nan=True)
    *_, (kc2, vc2) = _case(KVLayout.SHUFFLE, torch.float16, 16)
    write_kv_ref(k, v, kc2, vc2, slots, KVLayout.SHUFFLE)  # writing shuffle directly = shuffling flash
    torch.testing.assert_close(kc2, ks, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vc2, vs, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("layout", list(KVLayout))
def test_fp8_write_read_round_trip_within_quantization_error(layout, per_token):
    num_blocks, block_size = 5, 16
    k, v, slots, (kc, vc) = _case(layout, FP8, block_size, num_blocks=num_blocks)
    k_scale = (
        torch.zeros(num_blocks, 2, block_size, device=DEVICE)
        if per_token
        else torch.tensor([0.02], device=DEVICE)
    )
    v_scale = k_scale.clone() if per_token else torch.tensor([0.03], device=DEVICE)
    backend = "triton" if GPU else "torch"  # the interpreter's fp8 conversion is wrong
    write_kv(k, v, kc, vc, slots, layout=layout, k_scale=k_scale, v_scale=v_scale, backend=backend)
    got_k, got_v = read_kv_ref(
        kc, vc, torch.arange(num_blocks, device=DEVICE), num_blocks * block_size, layout, k_scale, v_scale
    )
    keep = slots >= 0
    blk, off = slots[keep] // block_size, slots[keep] % block_size
    for got, want, scale in ((got_k[slots[keep]], k[keep], k_scale), (got_v[slots[keep]], v[keep], v_scale)):
        # e4m3 keeps 3 mantissa bits: relative error <= 2^-4, and below its normal range values round to
        # multiples of 2^-9 (times the scale: per tensor, or the token-head's own)
        step = scale[blk, :, off][..., None] * 2**-9 if per_token else scale * 2**-9
        bound = 2**-4 * want.abs() + step
        assert ((got - want).abs() <= bound).all(), (got - want).abs().max()
    if per_token:
        expected = k[keep].abs().amax(-1) / torch.finfo(FP8).max
        torch.testing.assert_close(k_scale[blk, :, off], expected)


@pytest.mark.gpu(reason="fp8 Triton writes are checked on the GPU (the interpreter's fp8 is wrong)")
@pytest.mark.parametrize("slot_pattern", ["random", "prefill"])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("layout", list(KVLayout))
def test_fp8_triton_write_equals_reference(layout, per_token, slot_pattern):
    k, v, slots, (kc, vc) = _case(layout, FP8, 16, num_blocks=6, heads=8, head_dim=128, tokens=40)
    if slot_pattern == "prefill":  # whole 16-token fp8 shuffle runs, sequences starting mid-run
        slots = _prefill_slots(16, [(19, 0), (21, 7)], 6)
        slots[5] = -1
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)  # a model's K/V
    shape = (6, 8, 16)
    scales = [
        torch.zeros(shape, device=DEVICE) if per_token else torch.tensor([s], device=DEVICE)
        for s in (0.02, 0.03)
    ]
    ref_scales = [s.clone() for s in scales]
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv(k, v, kc, vc, slots, layout=layout, k_scale=scales[0], v_scale=scales[1], backend="triton")
    write_kv_ref(k, v, kc_ref, vc_ref, slots, layout, *ref_scales)
    torch.testing.assert_close(scales[0], ref_scales[0], rtol=1e-6, atol=0)
    mismatch = (kc.float() != kc_ref.float()).float().mean().item()
    assert mismatch < 1e-3, f"{mismatch:.2%} of fp8 K elements differ from the reference rounding"
    assert (vc.float() != vc_ref.float()).float().mean().item() < 1e-3


@pytest.mark.gpu(reason="needs a GPU with > 4 GiB free")
def test_offsets_past_2_pow_31_bytes():
    num_blocks, block_size, heads, head_dim = 70_000, 16, 8, 128  # 2.3 GB per bf16 cache
    shape = kv_cache_shapes(KVLayout.FLASH, num_blocks, block_size, heads, head_dim, torch.bfloat16)[0]
    kc = torch.zeros(shape, dtype=torch.bfloat16, device=DEVICE)
    vc = torch.zeros_like(kc)
    assert kc.numel() * kc.element_size() > 2**31
    slots = torch.tensor([num_blocks * block_size - 1, (num_blocks - 3) * block_size + 5], device=DEVICE)
    k = torch.randn(2, heads, head_dim, device=DEVICE, dtype=torch.bfloat16)
    write_kv(k, k, kc, vc, slots, backend="triton")
    torch.testing.assert_close(kc[-1, -1], k[0], rtol=0, atol=0)
    torch.testing.assert_close(vc[num_blocks - 3, 5], k[1], rtol=0, atol=0)


def test_bad_inputs_are_named():
    shapes = kv_cache_shapes("flash", 2, 16, 2, 32, torch.float16)
    kc, vc = torch.zeros(shapes[0], dtype=torch.float16), torch.zeros(shapes[1], dtype=torch.float16)
    k = torch.randn(3, 2, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"slot_mapping must be \[3\]"):
        write_kv(k, k, kc, vc, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"k must be \[T, 2, 32\]"):
        write_kv(k[:, :1], k, kc, vc, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="takes none"):
        write_kv(k, k, kc, vc, torch.zeros(3, dtype=torch.long), k_scale=torch.ones(1), v_scale=torch.ones(1))
    with pytest.raises(ValueError, match="divisible by x=8"):
        kv_cache_shapes("shuffle", 2, 12, 2, 32, torch.float16)
    k_shape, v_shape = kv_cache_shapes("shuffle", 2, 16, 2, 32, torch.float16)
    numel = torch.Size(k_shape).numel()
    misaligned = torch.zeros(numel + 1, dtype=torch.float16)[1:].view(k_shape)  # contiguous, 2 bytes off
    with pytest.raises(ValueError, match="16-byte aligned"):
        write_kv(
            k,
            k,
            misaligned,
            torch.zeros(v_shape, dtype=torch.float16),
            torch.zeros(3, dtype=torch.long),
            layout="shuffle",
        )
