"""MLA: the latent-cache write and absorbed attention (decode, verify, extend) against the float64 reference."""

import pytest
import torch

from atom_kernels.cache.fp8 import fp8_max
from atom_kernels.mla import mla_attention, write_latent
from atom_kernels.mla.attention import MlaTiles
from atom_kernels.mla.ref import read_latent_ref, write_latent_ref

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# DeepSeek's widths on the GPU; narrower on the CPU interpreter, same code paths.
RANK, ROPE = (512, 64) if GPU else (64, 16)
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
TOL = {torch.float32: 2e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}
FP8 = torch.float8_e4m3fn


def _case(seq_lens, query_lens, heads, block_size, dtype, cache_dtype=None):
    """Random latent rows written at shuffled pages; page 0 and every unused row are NaN (never read)."""
    cache_dtype = cache_dtype or dtype
    pages = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(pages) + 2
    order = (torch.randperm(num_blocks - 1) + 1).tolist()
    tables = torch.zeros(len(seq_lens), max(pages) + 2, dtype=torch.int32)
    slots = []
    for b, n in enumerate(seq_lens):
        table = [order.pop() for _ in range(pages[b])]
        tables[b, : pages[b]] = torch.tensor(table, dtype=torch.int32)
        slots += [table[i // block_size] * block_size + i % block_size for i in range(n)]
    cache = torch.full((num_blocks, block_size, RANK + ROPE), float("nan"), device=DEVICE).to(cache_dtype)
    total = sum(seq_lens)
    kv_c, k_pe = torch.randn(total, RANK, device=DEVICE), torch.randn(total, ROPE, device=DEVICE)
    scale = None
    if cache_dtype == FP8:
        scale = (torch.cat([kv_c, k_pe], 1).abs().amax() / fp8_max(FP8)).reshape(1)
    write_latent_ref(kv_c.to(dtype), k_pe.to(dtype), cache, torch.tensor(slots, device=DEVICE), scale)
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(query_lens).cumsum(0)
    q = (torch.randn(int(cu[-1]), heads, RANK + ROPE, device=DEVICE) * 0.5).to(dtype)
    return dict(
        q=q,
        cache=cache,
        cu_seqlens_q=cu.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables.to(DEVICE),
        scale=scale,
        max_query_len=max(query_lens),
    )


def _run(case, softmax_scale, **kwargs):
    args = {k: v for k, v in case.items() if k != "max_query_len"}
    q = args.pop("q")
    out = torch.full((q.shape[0], q.shape[1], RANK), float("nan"), dtype=q.dtype, device=DEVICE)
    got = mla_attention(
        q,
        **args,
        softmax_scale=softmax_scale,
        max_query_len=case["max_query_len"],
        kv_lora_rank=RANK,
        out=out,
        backend="triton",
        **kwargs,
    )
    assert got.data_ptr() == out.data_ptr()
    want = mla_attention(
        q,
        **args,
        softmax_scale=softmax_scale,
        max_query_len=case["max_query_len"],
        kv_lora_rank=RANK,
        backend="torch",
    )
    return got, want


def _tiles(heads_as_n: bool, dtype: torch.dtype) -> MlaTiles | None:
    """None: the default tiles for the shape. The transposed loop: on the GPU 64-row tiles (a warpgroup
    MMA's least) and one stage for fp32 rows (two would not fit in shared memory)."""
    if not heads_as_n:
        return None
    if not GPU:
        return MlaTiles(16, 16, 1, 1, heads_as_n=True)
    return MlaTiles(16, 64, 4, 1 if dtype == torch.float32 else 2, heads_as_n=True)


SHAPES = [  # seq_lens, query_lens: decode, speculative verify, extend with a sequence that has no new tokens
    ([37, 5, 64], [1, 1, 1]),
    ([20, 33, 9], [1, 3, 4]),
    ([40, 12, 25], [6, 0, 25]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [1, 16] + ([64] if GPU else [4]))
@pytest.mark.parametrize(("seq_lens", "query_lens"), SHAPES)
@pytest.mark.parametrize(
    "heads", [16, 5] + ([128] if GPU else [33])
)  # 33: three head blocks, the last partial
@pytest.mark.parametrize("heads_as_n", [False, True], ids=["heads-m", "heads-n"])
def test_matches_reference(seq_lens, query_lens, block_size, heads, dtype, heads_as_n):
    case = _case(seq_lens, query_lens, heads, block_size, dtype)
    got, want = _run(case, softmax_scale=(RANK // 4 + ROPE) ** -0.5, tiles=_tiles(heads_as_n, dtype))
    assert not torch.isnan(got).any(), "an output row was not written, or a NaN row was read"
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("heads_as_n", [False, True], ids=["heads-m", "heads-n"])
@pytest.mark.parametrize("splits", [1, 2, 5])
def test_every_slice_count_gives_the_same_answer(splits, heads_as_n):
    # 5 slices of a 9-row sequence leave some slices empty: they must drop out of the combine.
    case = _case([70, 9, 33], [1, 2, 1], 16, 16, torch.float32)
    got, want = _run(case, softmax_scale=0.1, num_splits=splits, tiles=_tiles(heads_as_n, torch.float32))
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("heads_as_n", [False, True], ids=["heads-m", "heads-n"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_fp8_cache(block_size, heads_as_n):
    dtype = torch.bfloat16 if GPU else torch.float16
    case = _case([45, 17], [1, 2], 16, block_size, dtype, cache_dtype=FP8)
    got, want = _run(case, softmax_scale=0.08, tiles=_tiles(heads_as_n, dtype))
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("cache_dtype", [torch.float32, FP8])
def test_write_round_trip_skips_padding_and_saturates_fp8(cache_dtype):
    tokens, block_size = 9, 4
    kv_c, k_pe = torch.randn(tokens, RANK, device=DEVICE), torch.randn(tokens, ROPE, device=DEVICE)
    kv_c[0, 0] = 1e6  # beyond e4m3's range at this scale: stored saturated, never inf/NaN
    slots = torch.tensor([5, -1, 0, 11, 6, -1, 3, 8, 2], device=DEVICE)
    scale = torch.tensor([0.01], device=DEVICE) if cache_dtype == FP8 else None
    cache = torch.full((4, block_size, RANK + ROPE), float("nan"), device=DEVICE).to(cache_dtype)
    expected = cache.clone()
    # The CPU interpreter's fp8 conversion is wrong (it can drop an exponent step when rounding): fp8 Triton
    # writes are checked on the GPU, the torch path on the CPU.
    backend = "torch" if cache_dtype == FP8 and not GPU else "triton"
    write_latent(kv_c, k_pe, cache, slots, scale=scale, backend=backend)
    write_latent_ref(kv_c, k_pe, expected, slots, scale)
    rows, want = cache.view(-1, RANK + ROPE).float(), expected.view(-1, RANK + ROPE).float()
    assert torch.equal(torch.isnan(rows), torch.isnan(want)), "padding (-1) wrote, or a slot was skipped"
    written = slots[slots >= 0]
    if cache_dtype == FP8:
        # Within e4m3's own rounding of the true value: half a step (relative 2^-4, subnormals 2^-10).
        true = torch.cat([kv_c, k_pe], 1)[slots >= 0] / scale
        true = true.clamp(-fp8_max(FP8), fp8_max(FP8))
        assert ((rows[written] - true).abs() <= true.abs() * 2**-4 + 2**-10).all()
        assert float(rows[5, 0]) == fp8_max(FP8)
    else:
        torch.testing.assert_close(rows[written], want[written])
        table = torch.arange(4, device=DEVICE)
        back = read_latent_ref(cache, table, 16)
        torch.testing.assert_close(back[11].float(), torch.cat([kv_c[3], k_pe[3]]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(q=torch.zeros(3, 16, RANK)), r"q must be \[T, Hq"),
        (dict(cache=torch.zeros(4, 16, RANK)), r"cache must be a contiguous"),
        (dict(cache=torch.zeros(4, 16, RANK + ROPE, dtype=torch.float16)), r"must be q's"),
        (dict(cache=torch.zeros(4, 16, RANK + ROPE).to(FP8)), r"needs scale"),
        (dict(seq_lens=torch.ones(2, dtype=torch.int32)), r"disagree"),
    ],
)
def test_bad_input_is_named(change, message):
    args = dict(
        q=torch.zeros(3, 16, RANK + ROPE),
        cache=torch.zeros(4, 16, RANK + ROPE),
        cu_seqlens_q=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
        seq_lens=torch.ones(3, dtype=torch.int32),
        block_tables=torch.zeros(3, 1, dtype=torch.int32),
    )
    args.update(change)
    args = {k: v.to(DEVICE) for k, v in args.items()}
    with pytest.raises(ValueError, match=message):
        mla_attention(**args, softmax_scale=0.1, max_query_len=1, kv_lora_rank=RANK)
