"""fused_experts with e4m3 expert weights and block scales against the reference on dequantized weights:
weight-only, or W8A8 (activations quantized as the kernels quantize them) where the Triton path takes it."""

import pytest
import torch

from atom_kernels import fused_experts
from atom_kernels.fp8.ref import quantize_weight_ref
from atom_kernels.moe import ExpertScales, TileConfig
from atom_kernels.moe.fused import dequantize_experts, experts_quantize_input
from atom_kernels.moe.ref import fused_experts_ref, fused_experts_w8a8_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
# The kernels round each dequantized weight tile to x's dtype before the product; the reference keeps fp32.
TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}


def _quantized_experts(experts, rows, cols, block):
    qs, ss = zip(
        *(quantize_weight_ref(torch.randn(rows, cols) / cols**0.5, block) for _ in range(experts)),
        strict=True,
    )
    return torch.stack(qs).to(DEVICE), torch.stack(ss).to(DEVICE)


def _case(tokens, experts, k, hidden, inter, block, dtype):
    # seeded: the same data whatever ran before (another module's collection draws from the global
    # generator), so a W8A8 rounding tie the reference resolves the other way cannot come and go
    torch.manual_seed(tokens * 1000 + hidden)
    x = torch.randn(tokens, hidden, device=DEVICE).to(dtype)
    w13, s13 = _quantized_experts(experts, 2 * inter, hidden, block)
    w2, s2 = _quantized_experts(experts, hidden, inter, block)
    scores = torch.rand(tokens, experts, device=DEVICE)
    ids = scores.topk(k, dim=-1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, device=DEVICE), dim=-1)
    return x, w13, w2, weights, ids, ExpertScales(s13, s2, block)


def _reference(x, w13, w2, weights, ids, scales, *, w8a8=False):
    w13 = dequantize_experts(w13, scales.w13, scales.block, torch.float32)
    w2 = dequantize_experts(w2, scales.w2, scales.block, torch.float32)
    if w8a8:
        return fused_experts_w8a8_ref(x, w13, w2, weights, ids, scales.block[1])
    return fused_experts_ref(x, w13, w2, weights, ids)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "experts", "k", "hidden", "inter", "block"),
    [
        (1, 4, 2, 48, 32, (16, 16)),  # hidden 48: three k-blocks; decode-sized
        (9, 8, 2, 40, 24, (8, 16)),  # ragged: 40 = 2.5 blocks of 16; block_n 8 divides inter 24
        (33, 6, 3, 64, 32, (32, 32)),  # W8A8 on the Triton path
        (5, 4, 2, 96, 64, (32, 64)),  # hidden 96: 1.5 k-blocks of 64, weight-only by default
        (1, 4, 2, 64, 32, (32, 32)),  # one token of small experts: weight-only
    ],
)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_fp8_experts_match_the_dequantized_reference(
    tokens, experts, k, hidden, inter, block, dtype, backend
):
    x, w13, w2, weights, ids, scales = _case(tokens, experts, k, hidden, inter, block, dtype)
    got = fused_experts(x, w13, w2, weights, ids, scales=scales, backend=backend)
    w8a8 = backend == "triton" and experts_quantize_input(block, tokens, k, experts, hidden, inter)
    want = _reference(x, w13, w2, weights, ids, scales, w8a8=w8a8)
    torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])


def test_scales_matter():
    # Doubling one expert's scales changes exactly the tokens routed to it.
    x, w13, w2, weights, ids, scales = _case(6, 4, 1, 32, 16, (16, 16), torch.float32)
    base = fused_experts(x, w13, w2, weights, ids, scales=scales, backend="triton")
    s13 = scales.w13.clone()
    s13[int(ids[0, 0])] *= 2
    changed = fused_experts(x, w13, w2, weights, ids, scales=ExpertScales(s13, scales.w2, scales.block))
    hit = (ids[:, 0] == ids[0, 0]).cpu()
    assert not torch.allclose(changed[hit], base[hit]) and torch.equal(changed[~hit], base[~hit])


def test_small_k_tiles_follow_the_scale_block():
    x, w13, w2, weights, ids, scales = _case(20, 4, 2, 64, 32, (16, 16), torch.float32)
    cfg = TileConfig(16, 16, 64, group_m=2, num_warps=1, num_stages=1)  # k-step cut to the 16-wide block
    got = fused_experts(x, w13, w2, weights, ids, scales=scales, config=cfg, backend="triton")
    torch.testing.assert_close(got, _reference(x, w13, w2, weights, ids, scales), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(block=(16, 24)), r"block_k be a power of two"),
        (dict(block=(12, 16)), r"block_n must divide the intermediate size 16"),
        (dict(s2=torch.ones(4, 2, 2)), r"w2 scales must be contiguous float32 \(4, 2, 1\)"),
        (dict(w13=torch.zeros(4, 32, 32)), r"go with float8_e4m3fn weights"),
    ],
)
def test_bad_scales_are_named(change, message):
    x, w13, w2, weights, ids, scales = _case(6, 4, 2, 32, 16, (16, 16), torch.float32)
    w13 = change.get("w13", w13).to(DEVICE)
    s2 = change.get("s2", scales.w2).to(DEVICE)
    bad = ExpertScales(scales.w13, s2, change.get("block", scales.block))
    with pytest.raises(ValueError, match=message):
        fused_experts(x, w13, w2, weights, ids, scales=bad)


def test_weight_only_on_request_and_w8a8_refused_where_block_k_cannot():
    x, w13, w2, weights, ids, scales = _case(12, 4, 2, 64, 32, (32, 32), torch.float32)
    got = fused_experts(x, w13, w2, weights, ids, scales=scales, quantize_input=False, backend="triton")
    torch.testing.assert_close(got, _reference(x, w13, w2, weights, ids, scales), rtol=2e-4, atol=2e-4)
    x, w13, w2, weights, ids, scales = _case(3, 4, 2, 48, 32, (16, 16), torch.float32)
    with pytest.raises(ValueError, match=r"block_k is a power of two >= 32; got block \(16, 16\)"):
        fused_experts(x, w13, w2, weights, ids, scales=scales, quantize_input=True, backend="triton")


def test_w8a8_where_it_was_faster():
    block = (128, 128)
    assert experts_quantize_input(block, 64, 8, 128, 2048, 768)  # Qwen3-30B-A3B, 64 tokens
    assert not experts_quantize_input(block, 1, 8, 128, 2048, 768)  # one token of small experts
    assert experts_quantize_input(block, 1, 8, 256, 7168, 2048)  # one token of DeepSeek-V3's
    assert not experts_quantize_input(block, 4096, 8, 128, 2048, 768)  # tall tiles: weight-only
    assert not experts_quantize_input((128, 96), 64, 8, 128, 2048, 768)  # block_k not a power of two
    assert not experts_quantize_input((64, 64), 8, 2, 4, 64, 96)  # inter 96: a ragged 64-group
    for hidden, inter, block in (
        (64, 32, (32, 32)),
        (96, 64, (32, 64)),
    ):  # asked for: W8A8, ragged groups too
        x, w13, w2, weights, ids, scales = _case(5, 4, 2, hidden, inter, block, torch.float32)
        got = fused_experts(x, w13, w2, weights, ids, scales=scales, quantize_input=True, backend="triton")
        want = _reference(x, w13, w2, weights, ids, scales, w8a8=True)
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
