"""Token ordering by expert and fused_experts against the per-expert torch reference."""

import pytest
import torch

from atom_kernels import fused_experts
from atom_kernels.moe import TileConfig, order_by_expert
from atom_kernels.moe.align import order_one_token
from atom_kernels.moe.combine import combine_topk
from atom_kernels.moe.fused import _experts_static
from atom_kernels.moe.ref import fused_experts_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 3e-2}


def _routing(tokens, experts, k, *, skew=False):
    """Distinct experts per token; skew sends most tokens to a few experts (load imbalance)."""
    scores = torch.rand(tokens, experts, device=DEVICE)
    if skew:
        scores[:, :2] += 10
    ids = scores.topk(k, dim=-1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, device=DEVICE), dim=-1)
    return weights, ids


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "k", "hidden"), [(1, 8, 64), (5, 3, 100), (3, 2, 2100), (0, 4, 32)])
def test_combine_sums_each_tokens_expert_rows(tokens, k, hidden, dtype):
    """fp32 sums in pair order, one rounding: the fp32 sum of the same rows, within one rounding to the
    output dtype (and fp32's summation-order error); a strided out (a view into a wider buffer) gets only
    its columns."""
    y = torch.randn(tokens * k, hidden, device=DEVICE).to(dtype)
    wide = torch.full((tokens, hidden + 7), 5.0, device=DEVICE, dtype=dtype)
    out = combine_topk(y, k, wide[:, :hidden])
    want = y.view(tokens, k, hidden).float().sum(1)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), want, rtol=eps, atol=4 * k * eps)
    assert (wide[:, hidden:] == 5).all()
    with pytest.raises(ValueError, match=r"y \[T \* 3, H\]"):
        combine_topk(torch.randn(4, 8, device=DEVICE), 3, torch.empty(1, 8, device=DEVICE))


@pytest.mark.parametrize("one_program", [True, False], ids=["one-launch", "multi-launch"])
@pytest.mark.parametrize(
    ("tokens", "experts", "k", "block_m"),
    [
        (1, 4, 2, 16),
        (37, 8, 3, 16),
        (20, 64, 8, 4),
        (50, 3, 1, 8),
        (9, 16, 4, 32),
        (6, 256, 8, 16),
        (0, 8, 2, 16),
    ],
)
def test_order_by_expert_groups_every_pair_once(tokens, experts, k, block_m, one_program):
    """Both paths (one program for decode's few pairs, several launches beyond). In the one-program path
    160 pairs over 64 experts run through five 32-pair blocks, and 256 experts (DeepSeek-V3's) 48 pairs
    through two; no pairs at all leaves nothing in use."""
    _, ids = _routing(tokens, experts, k, skew=tokens > 30)
    order = order_by_expert(ids, experts, block_m, one_program=one_program)
    pairs = tokens * k
    rows = order.sorted_pairs.cpu().tolist()
    used = int(order.num_padded)
    assert used % block_m == 0 and all(p == pairs for p in rows[used:])
    real = [p for p in rows[:used] if p != pairs]
    assert sorted(real) == list(range(pairs)), "each (token, slot) pair exactly once"
    flat = ids.reshape(-1).cpu().tolist()
    tile_expert = order.tile_expert.cpu().tolist()
    for i, p in enumerate(rows[:used]):
        if p != pairs:
            assert flat[p] == tile_expert[i // block_m], "a pair in another expert's tile"
    counts = torch.bincount(ids.reshape(-1).long().cpu(), minlength=experts)
    assert used == int(((counts + block_m - 1) // block_m * block_m).sum())


CASES = [  # tokens, experts, k, hidden, inter
    (1, 4, 2, 32, 16),
    (5, 8, 2, 48, 24),  # hidden and inter not multiples of the interpreter's 32-wide tiles
    (40, 6, 3, 64, 32),
    (17, 16, 4, 32, 48),
    (33, 4, 1, 32, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "experts", "k", "hidden", "inter"), CASES)
def test_fused_experts_matches_reference(tokens, experts, k, hidden, inter, dtype):
    x = torch.randn(tokens, hidden, device=DEVICE).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=DEVICE) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=DEVICE) / inter**0.5).to(dtype)
    weights, ids = _routing(tokens, experts, k, skew=tokens > 30)
    out = torch.full((tokens, hidden), float("nan"), dtype=dtype, device=DEVICE)
    got = fused_experts(x, w13, w2, weights, ids, out=out, backend="triton")
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(got).any()
    torch.testing.assert_close(
        got, fused_experts_ref(x, w13, w2, weights, ids), rtol=TOL[dtype], atol=TOL[dtype]
    )


def test_one_token_takes_a_tile_per_pair_even_with_repeated_ids():
    """One token skips the ordering kernel (order_one_token): its tiles are its pairs, whatever the ids."""
    x = torch.randn(1, 32, device=DEVICE)
    w13, w2 = torch.randn(4, 32, 32, device=DEVICE) / 6, torch.randn(4, 32, 16, device=DEVICE) / 4
    ids = torch.tensor([[2, 0, 2]], dtype=torch.int32, device=DEVICE)
    weights = torch.tensor([[0.5, 0.3, 0.2]], device=DEVICE)
    order = order_one_token(ids, 16)
    assert order.pair_tiles and order.capacity == 48 and order.tile_expert.tolist() == [2, 0, 2]
    got = fused_experts(x, w13, w2, weights, ids, backend="triton")
    torch.testing.assert_close(got, fused_experts_ref(x, w13, w2, weights, ids), rtol=2e-4, atol=2e-4)
    with pytest.raises(ValueError, match="one token's ids"):
        order_one_token(ids.expand(2, 3), 16)


@pytest.mark.parametrize("block_m", [16, 32])
def test_tile_shapes_do_not_change_the_result(block_m):
    tokens, experts, k, hidden, inter = 23, 8, 2, 64, 32
    x = torch.randn(tokens, hidden, device=DEVICE)
    w13 = torch.randn(experts, 2 * inter, hidden, device=DEVICE) / 8
    w2 = torch.randn(experts, hidden, inter, device=DEVICE) / 8
    weights, ids = _routing(tokens, experts, k)
    cfg = TileConfig(block_m, 16, 16, group_m=3, num_warps=1, num_stages=1)
    got = fused_experts(x, w13, w2, weights, ids, config=cfg, backend="triton")
    torch.testing.assert_close(got, fused_experts_ref(x, w13, w2, weights, ids), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize(("experts", "top_k", "tokens"), [(8, 2, 3), (4, 2, 5), (16, 4, 1)])
def test_torch_backends_capture_safe_form_equals_the_reference(experts, top_k, tokens):
    # tokens * top_k < experts gathers the chosen experts' weights; otherwise every expert runs densely.
    x = torch.randn(tokens, 32, device=DEVICE)
    w13, w2 = torch.randn(experts, 96, 32, device=DEVICE) / 6, torch.randn(experts, 32, 48, device=DEVICE) / 7
    weights, ids = _routing(tokens, experts, top_k)
    torch.testing.assert_close(
        _experts_static(x, w13, w2, weights, ids),
        fused_experts_ref(x, w13, w2, weights, ids),
        rtol=1e-5,
        atol=1e-5,
    )


def test_capture_safe_form_sums_every_expert_before_rounding_in_bf16():
    """The dense form adds E expert terms: a bf16 running sum rounds E times (4-8 bf16 ulps off here,
    every term positive), the kernels and the reference once (1 ulp at most)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    experts, hidden, inter, tokens = 128, 32, 16, 2
    x = torch.rand(tokens, hidden, generator=gen).bfloat16()
    w13 = (torch.rand(experts, 2 * inter, hidden, generator=gen) / 4).bfloat16()
    w2 = (torch.rand(experts, hidden, inter, generator=gen) / 4).bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)]).int()
    weights = torch.softmax(torch.randn(tokens, experts, generator=gen), dim=-1)
    got = _experts_static(x, w13, w2, weights, ids).float()
    want = fused_experts_ref(x, w13, w2, weights, ids).float()
    ulp = 2.0 ** (torch.floor(torch.log2(want.abs())) - 7)
    assert ((got - want).abs() / ulp).max() <= 1.5


def test_torch_backend_and_empty_batch():
    x = torch.randn(6, 32, device=DEVICE)
    w13, w2 = torch.randn(4, 32, 32, device=DEVICE) / 6, torch.randn(4, 32, 16, device=DEVICE) / 4
    weights, ids = _routing(6, 4, 2)
    torch.testing.assert_close(
        fused_experts(x, w13, w2, weights, ids, backend="torch"),
        fused_experts(x, w13, w2, weights, ids, backend="triton"),
        rtol=2e-4,
        atol=2e-4,
    )
    empty = fused_experts(x[:0], w13, w2, weights[:0], ids[:0], backend="triton")
    assert empty.shape == (0, 32)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(w13=torch.zeros(4, 31, 32)), r"must be \[E, 2I, H\]"),
        (dict(w2=torch.zeros(4, 32, 8)), r"must be \[E, H, I\]"),
        (dict(ids=torch.zeros(5, 2, dtype=torch.int32)), r"must both be \[T=6, k\]"),
        (dict(w2=torch.zeros(4, 32, 16, dtype=torch.float16)), r"must be torch.float32 like x"),
        (dict(x=torch.zeros(6, 32)[None]), r"expects x \[T, H\]"),
    ],
)
def test_bad_input_is_named(change, message):
    args = dict(
        x=torch.randn(6, 32),
        w13=torch.randn(4, 32, 32),
        w2=torch.randn(4, 32, 16),
        weights=torch.rand(6, 2),
        ids=torch.randint(0, 4, (6, 2), dtype=torch.int32),
    )
    args.update(change)
    args = {name: t.to(DEVICE) for name, t in args.items()}
    with pytest.raises(ValueError, match=message):
        fused_experts(args["x"], args["w13"], args["w2"], args["weights"], args["ids"])


@pytest.mark.gpu(reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("tokens", [1, 16])  # one token: the ids are the tiles (no ordering kernel)
def test_captured_in_a_cuda_graph_with_new_routing_each_replay(tokens):
    experts, k, hidden, inter = 32, 4, 256, 128
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)
    w13 = (torch.randn(experts, 2 * inter, hidden, device=DEVICE) / 16).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, device=DEVICE) / 11).to(torch.bfloat16)
    weights, ids = _routing(tokens, experts, k)
    out = torch.empty_like(x)
    fused_experts(x, w13, w2, weights, ids, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_experts(x, w13, w2, weights, ids, out=out)
    for skew in (False, True):
        new_w, new_ids = _routing(tokens, experts, k, skew=skew)
        weights.copy_(new_w)
        ids.copy_(new_ids)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(out, fused_experts_ref(x, w13, w2, weights, ids), rtol=3e-2, atol=3e-2)
