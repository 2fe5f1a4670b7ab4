"""Paged prefill and decode against the float64 torch reference, on fresh random scenarios."""

import pytest
import torch

from atom_kernels.attention import paged_decode, paged_prefill
from atom_kernels.cache import KVLayout
from atom_kernels.cache.fp8 import default_fp8_dtype

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
TOL = {torch.float32: 2e-4 if not GPU else 1e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2}
HEAD_DIM = 128 if GPU else 32
LAYOUTS = list(KVLayout)


def _check(out, case, **kw):
    assert not torch.isnan(out).any(), "an output element was not written, or a poisoned KV entry was read"
    expected = case.reference(**kw)
    tol = TOL[case.q.dtype]
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


def _poisoned_like(q):
    return torch.full_like(q, float("nan"))


def _combos(pages_heads):
    """(layout, block_size, heads) for both layouts, except shuffle with pages smaller than its x."""
    return [(lay, b, h) for lay in LAYOUTS for b, h in pages_heads if lay is KVLayout.FLASH or b >= 16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("layout", "block_size", "heads"), _combos([(1, (4, 4)), (16, (8, 2)), (16, (12, 4)), (64, (8, 1))])
)
def test_prefill_ragged_with_prefix(paged_case, dtype, layout, block_size, heads):
    # a plain prompt, a prefix-cached extend, a one-token extend, a long plain prompt
    seq_lens, query_lens = [37, 50, 19, 70], [37, 21, 1, 70]
    case = paged_case(
        seq_lens=seq_lens,
        query_lens=query_lens,
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=HEAD_DIM,
        block_size=block_size,
        layout=layout,
        dtype=dtype,
        device=DEVICE,
    )
    out = paged_prefill(
        case.q,
        case.k_cache,
        case.v_cache,
        max_query_len=case.max_query_len,
        layout=layout,
        out=_poisoned_like(case.q),
        backend="triton",
        **case.args(),
    )
    _check(out, case, layout=layout)


@pytest.mark.parametrize(
    "features",
    [
        {"sliding_window": 9},
        {"softcap": 5.0},
        {"sinks": True},
        {"sliding_window": 16, "softcap": 3.0, "sinks": True},
    ],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefill_window_softcap_sinks(paged_case, features, layout):
    features = dict(features)
    case = paged_case(
        seq_lens=[45, 33],
        query_lens=[45, 12],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=layout,
        dtype=torch.float32,
        device=DEVICE,
    )
    if features.pop("sinks", False):
        features["sinks"] = torch.randn(4, device=DEVICE) * 2
    out = paged_prefill(
        case.q,
        case.k_cache,
        case.v_cache,
        max_query_len=case.max_query_len,
        layout=layout,
        out=_poisoned_like(case.q),
        backend="triton",
        **features,
        **case.args(),
    )
    _check(out, case, layout=layout, **features)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("layout", "block_size", "heads"), _combos([(1, (4, 1)), (16, (8, 2)), (64, (16, 2))])
)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_ragged(paged_case, dtype, layout, block_size, heads, num_splits):
    seq_lens = [1, 17, 64, 130, 33]
    case = paged_case(
        seq_lens=seq_lens,
        query_lens=[1] * 5,
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=HEAD_DIM,
        block_size=block_size,
        layout=layout,
        dtype=dtype,
        device=DEVICE,
    )
    out = paged_decode(
        case.q,
        case.k_cache,
        case.v_cache,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        layout=layout,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        num_splits=num_splits,
        out=_poisoned_like(case.q),
        backend="triton",
    )
    _check(out, case, layout=layout)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_speculative_verify_window_sinks(paged_case, num_splits, layout):
    case = paged_case(
        seq_lens=[20, 67, 9],
        query_lens=[3, 3, 3],
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=layout,
        dtype=torch.float32,
        device=DEVICE,
    )
    sinks = torch.randn(8, device=DEVICE)
    out = paged_decode(
        case.q,
        case.k_cache,
        case.v_cache,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        query_len=3,
        layout=layout,
        sliding_window=12,
        sinks=sinks,
        num_splits=num_splits,
        out=_poisoned_like(case.q),
        backend="triton",
    )
    _check(out, case, layout=layout, sliding_window=12, sinks=sinks)


@pytest.mark.parametrize("scales", ["tensor", "token"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_cache(paged_case, layout, scales):
    dtype = torch.bfloat16 if GPU else torch.float32
    fp8 = default_fp8_dtype(torch.device(DEVICE))
    case = paged_case(
        seq_lens=[40, 77, 16],
        query_lens=[1, 1, 1],
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=layout,
        dtype=dtype,
        cache_dtype=fp8,
        fp8_scales=scales,
        device=DEVICE,
    )
    backend = "triton" if GPU else "torch"  # the interpreter's fp8 conversion is wrong
    out = paged_decode(
        case.q,
        case.k_cache,
        case.v_cache,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        layout=layout,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        num_splits=2,
        out=_poisoned_like(case.q),
        backend=backend,
    )
    _check(out, case, layout=layout)  # the reference dequantizes the same fp8 cache


def test_auto_splits_on_long_sequences(paged_case):
    case = paged_case(
        seq_lens=[300, 5],
        query_lens=[1, 1],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=KVLayout.FLASH,
        dtype=torch.float32,
        device=DEVICE,
    )
    out = paged_decode(
        case.q,
        case.k_cache,
        case.v_cache,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        out=_poisoned_like(case.q),
        backend="triton",
    )
    _check(out, case)


@pytest.mark.gpu(reason="the plan sizes programs by the GPU's SM count")
def test_short_walk_plan_choices():
    """Short walks: splits rounded down to fill two programs per SM, four-warp programs where they are
    few (128-wide tiles from 512 positions each, heads up to 128); long walks keep the generic plan."""
    from atom_kernels.attention.decode import short_walk_plan

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    splits, tiles = short_walk_plan(1, 8, 1024, dev)
    assert splits == 16 and (tiles.num_warps, tiles.block_n) == (4, 64)  # 1024 / 64: one tile a split
    splits, tiles = short_walk_plan(64, 4, 1024, dev)
    # 64 x 4 programs a split: as many splits as keep to two programs an SM (one on an H100 / H200)
    assert tiles.num_warps == 4 and splits * 256 <= max(2 * sms, 256) < 2 * splits * 256
    assert tiles.block_n == (128 if 1024 // splits >= 512 else 64)
    assert short_walk_plan(64, 4, 1024, dev, head_dim=256)[1].block_n == 64
    assert short_walk_plan(4, 8, 32768, dev) is None  # 2048+ positions a program: generic


@pytest.mark.parametrize(
    ("batch", "kv_heads", "head_dim", "seq_len", "max_len"),
    [(1, 2, 128, 600, 1024), (1, 1, 128, 600, 65536), (3, 1, 256, 700, 1024)],
)
def test_decode_short_walk_plans_match_the_reference(paged_case, batch, kv_heads, head_dim, seq_len, max_len):
    """paged_decode's own plan (short_walk_plan's on a GPU) at engine-like short contexts, 16-bit cache:
    64-wide four-warp tiles, 128-wide ones (a graph sized for 64k), and 256-wide heads."""
    dtype = torch.bfloat16 if GPU else torch.float32
    case = paged_case(
        seq_lens=[seq_len - 37 * b for b in range(batch)],
        query_lens=[1] * batch,
        num_q_heads=4 * kv_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim if GPU else 32,
        block_size=16,
        layout=KVLayout.FLASH,
        dtype=dtype,
        device=DEVICE,
    )
    out = paged_decode(
        case.q,
        case.k_cache,
        case.v_cache,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        max_seq_len=max_len,
        out=_poisoned_like(case.q),
        backend="triton",
    )
    _check(out, case)


def test_torch_backend_matches_reference(paged_case):
    case = paged_case(
        seq_lens=[10, 30],
        query_lens=[10, 4],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=16,
        layout=KVLayout.SHUFFLE,
        dtype=torch.float32,
        device=DEVICE,
    )
    out = paged_prefill(
        case.q, case.k_cache, case.v_cache, max_query_len=10, layout="shuffle", backend="torch", **case.args()
    )
    _check(out, case, layout="shuffle")


def test_bad_inputs_are_named(paged_case):
    case = paged_case(
        seq_lens=[10],
        query_lens=[10],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=16,
        layout=KVLayout.FLASH,
        dtype=torch.float32,
        device=DEVICE,
    )
    with pytest.raises(ValueError, match="Hq a multiple of Hkv=2"):
        paged_prefill(case.q[:, :3], case.k_cache, case.v_cache, max_query_len=10, **case.args())
    with pytest.raises(ValueError, match="sinks must be"):
        paged_prefill(
            case.q, case.k_cache, case.v_cache, max_query_len=10, sinks=torch.zeros(3), **case.args()
        )
    with pytest.raises(ValueError, match="expected B \\* query_len = 2"):
        paged_decode(
            case.q[:1],
            case.k_cache,
            case.v_cache,
            seq_lens=case.seq_lens,
            block_tables=case.block_tables,
            query_len=2,
        )
