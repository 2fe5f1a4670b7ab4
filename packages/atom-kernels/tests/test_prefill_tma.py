"""The TMA prefill kernel (Hopper+) against the float64 reference; on the CPU it runs under the interpreter."""

import pytest
import torch

from atom_kernels.attention import paged_prefill
from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.launch import TileConfig, check_inputs
from atom_kernels.attention.prefill import TMA_CONFIG
from atom_kernels.attention.prefill_tma import run_tma_prefill, tma_layout_fits, tma_prefill_fits
from atom_kernels.cache import KVLayout

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float16] + ([torch.bfloat16] if GPU else [])
TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
HEAD_DIM = 128 if GPU else 32
CONFIG = TMA_CONFIG if GPU else TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)
PAGES = [64, 128] if GPU else [16, 32]


def _call(case, **kw):
    return PagedCall(
        case.q, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens, case.block_tables,
        sliding_window=kw.get("sliding_window"), softcap=kw.get("softcap"), sinks=kw.get("sinks"),
        out=torch.full_like(case.q, float("nan")),
    )  # fmt: skip


def _checked(case, **kw):
    return check_inputs(_call(case, **kw))


def _run(case, **kw):
    call = _call(case, **kw)
    c = check_inputs(call)
    assert tma_layout_fits(case.k_cache, case.v_cache, c, CONFIG.block_n)
    return run_tma_prefill(call, c, max_query_len=case.max_query_len, config=CONFIG)


def _check(out, case, **kw):
    assert not torch.isnan(out).any(), "an output element was not written, or a poisoned KV entry was read"
    want = case.reference(**kw)
    tol = TOL[case.q.dtype]
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", PAGES)
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1)])
def test_ragged_prefix_cached_and_partial_pages(paged_case, dtype, block_size, heads):
    # a plain prompt, a prefix-cached extend, a one-token extend, a prompt ending mid-page (NaN beyond it)
    p = block_size
    seq_lens, query_lens = [p + 5, 3 * p - 7, 2 * p, 2 * p + 1], [p + 5, p + 3, 1, 2 * p + 1]
    case = paged_case(
        seq_lens=seq_lens,
        query_lens=query_lens,
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=HEAD_DIM,
        block_size=block_size,
        layout=KVLayout.FLASH,
        dtype=dtype,
        device=DEVICE,
    )
    _check(_run(case), case)


@pytest.mark.parametrize(
    "features",
    [
        {"sliding_window": 9},
        {"sliding_window": 40},
        {"softcap": 5.0},
        {"sinks": True},
        {"sliding_window": 20, "softcap": 3.0, "sinks": True},
    ],
)
def test_window_softcap_sinks(paged_case, features):
    features = dict(features)
    p = PAGES[0]
    case = paged_case(
        seq_lens=[3 * p - 3, 2 * p + 9],
        query_lens=[3 * p - 3, p - 2],
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=p,
        layout=KVLayout.FLASH,
        dtype=torch.float16,
        device=DEVICE,
    )
    if features.pop("sinks", False):
        features["sinks"] = torch.randn(8, device=DEVICE) * 2
    _check(_run(case, **features), case, **features)


def test_packed_k_and_v_views(paged_case):
    """vLLM's cache: K and V of a token-head side by side, V a view one head_dim past K."""
    p, heads_kv = PAGES[0], 2
    case = paged_case(
        seq_lens=[2 * p + 3, p],
        query_lens=[2 * p + 3, 5],
        num_q_heads=4,
        num_kv_heads=heads_kv,
        head_dim=HEAD_DIM,
        block_size=p,
        layout=KVLayout.FLASH,
        dtype=torch.float16,
        device=DEVICE,
    )
    n = case.k_cache.shape[0]
    buf = torch.full((n, p, heads_kv, 2 * HEAD_DIM), float("nan"), dtype=torch.float16, device=DEVICE)
    buf[..., :HEAD_DIM], buf[..., HEAD_DIM:] = case.k_cache, case.v_cache
    kc, vc = buf[..., :HEAD_DIM], buf[..., HEAD_DIM:]
    packed = type(case)(**{**vars(case), "k_cache": kc, "v_cache": vc})
    _check(_run(packed), case)


def test_layouts_the_kernel_cannot_address_are_refused(paged_case):
    p = PAGES[0]
    case = paged_case(
        seq_lens=[p],
        query_lens=[p],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=p,
        layout=KVLayout.FLASH,
        dtype=torch.float16,
        device=DEVICE,
    )
    c = _checked(case)
    assert tma_layout_fits(case.k_cache, case.v_cache, c, CONFIG.block_n)
    assert not tma_layout_fits(case.k_cache, case.v_cache, c, 3 * p)  # a tile would span pages
    heads_first = case.k_cache.transpose(1, 2).contiguous().transpose(1, 2)  # pages not runs of token rows
    assert not tma_layout_fits(heads_first, heads_first, c, CONFIG.block_n)
    shuffle = paged_case(
        seq_lens=[p],
        query_lens=[p],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=p,
        layout=KVLayout.SHUFFLE,
        dtype=torch.float16,
        device=DEVICE,
    )
    c_shuffle = check_inputs(
        PagedCall(
            shuffle.q, shuffle.k_cache, shuffle.v_cache, shuffle.cu_seqlens_q, shuffle.seq_lens,
            shuffle.block_tables, layout="shuffle",
        )
    )  # fmt: skip
    assert not tma_layout_fits(shuffle.k_cache, shuffle.v_cache, c_shuffle, CONFIG.block_n)
    if not GPU:
        assert not tma_prefill_fits(_call(case), c, CONFIG.block_n)  # not on a CPU


@pytest.mark.sm90(reason="TMA needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_prefill_takes_the_tma_kernel_on_hopper(paged_case, dtype):
    case = paged_case(
        seq_lens=[300, 200, 64],
        query_lens=[300, 77, 64],
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=64,
        layout=KVLayout.FLASH,
        dtype=dtype,
        device=DEVICE,
    )
    assert tma_prefill_fits(_call(case), _checked(case), TMA_CONFIG.block_n)
    out = paged_prefill(
        case.q,
        case.k_cache,
        case.v_cache,
        max_query_len=case.max_query_len,
        out=torch.full_like(case.q, float("nan")),
        **case.args(),
    )
    _check(out, case)
