"""MXFP4 experts: the quantizer's rounding (OCP MX), its dequantization against transformers' own, and the
expert GEMMs unpacking MXFP4 tiles against the reference on the dequantized weights, at ragged shapes."""

import pytest
import torch

from atom_kernels import fused_experts
from atom_kernels.moe import (
    SILU,
    ExpertActivation,
    ExpertBiases,
    ExpertMxfp4,
    dequantize_mxfp4,
    quantize_mxfp4,
)
from atom_kernels.moe.expert_gemm import mxfp4_block_k
from atom_kernels.moe.ref import fused_experts_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 3e-2}


def test_representable_values_round_trip_exactly_and_ties_go_to_the_even_code():
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    w = torch.cat([grid, -grid, grid.flip(0), -grid.flip(0)]).reshape(1, 32) * 2.0**-3  # one scale: 2**-3
    blocks, scales = quantize_mxfp4(w)
    assert blocks.shape == (1, 16) and scales.shape == (1, 1) and blocks.dtype == scales.dtype == torch.uint8
    torch.testing.assert_close(dequantize_mxfp4(blocks, scales, torch.float32), w, rtol=0, atol=0)
    # amax 6 -> scale 2**(2 - 2) = 1: midpoints between codes round to the even code, past 6 saturates
    w = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 7.9] + [0.0] * 22).reshape(1, 32)
    got = dequantize_mxfp4(*quantize_mxfp4(w), torch.float32)[0, :10].tolist()
    assert got == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, 6.0]
    zero_blocks, zero_scales = quantize_mxfp4(torch.zeros(2, 64))
    assert (dequantize_mxfp4(zero_blocks, zero_scales, torch.float32) == 0).all()


def test_quantization_error_is_within_half_a_step():
    w = torch.randn(3, 5, 128) * torch.logspace(-3, 2, 5)[None, :, None]
    dq = dequantize_mxfp4(*quantize_mxfp4(w), torch.float32)
    groups = w.unflatten(-1, (-1, 32))
    step = torch.exp2(torch.floor(torch.log2(groups.abs().amax(-1))) - 2)  # the group's scale
    # e2m1's widest gap is 2 (between 4 and 6) in units of the scale; saturation adds less than that
    assert ((dq - w).unflatten(-1, (-1, 32)).abs() <= step[..., None] * 2 + 1e-12).all()
    with pytest.raises(ValueError, match="groups of 32"):
        quantize_mxfp4(torch.randn(4, 48))


def _mxfp4_experts(experts, hidden, inter, dtype):
    w13 = torch.randn(experts, 2 * inter, hidden, device=DEVICE) * 2 / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, device=DEVICE) / inter**0.5
    (q13, s13), (q2, s2) = quantize_mxfp4(w13), quantize_mxfp4(w2)
    mx = ExpertMxfp4(s13, s2)
    d13, d2 = mx.dequantize(q13, q2, dtype)
    return q13, q2, mx, d13, d2


# (tokens, experts, k, hidden, inter). 96: k-steps of 32 dividing it. The GEMVs (mxfp4_gemv.py): one
# token, 3 tokens on 32 experts (several k-steps and a partial last one at the interpreter's 64), and on
# the GPU 2 tokens on 16 at K = 544 and 288 (the same at the GPU's 256; minutes under the interpreter).
# The tile GEMMs: 7 tokens on 8 experts, 40 on 6.
GEMV_SHAPES = [
    (1, 4, 2, 64, 32),
    (3, 32, 2, 96, 64),
    pytest.param(2, 16, 2, 544, 288, marks=pytest.mark.gpu(reason="the GPU's 256-value k-steps")),
]
TILE_SHAPES = [(7, 8, 2, 96, 64), (40, 6, 3, 64, 96)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("oai", [False, True], ids=["silu", "swiglu_oai+biases"])
@pytest.mark.parametrize(("tokens", "experts", "k", "hidden", "inter"), GEMV_SHAPES + TILE_SHAPES)
def test_triton_mxfp4_experts_match_the_reference_on_dequantized_weights(
    tokens, experts, k, hidden, inter, oai, dtype
):
    q13, q2, mx, d13, d2 = _mxfp4_experts(experts, hidden, inter, dtype)
    x = torch.randn(tokens, hidden, device=DEVICE).to(dtype)
    ids = torch.rand(tokens, experts, device=DEVICE).topk(k, dim=-1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, device=DEVICE), dim=-1)
    extra = {}
    if oai:
        extra = dict(
            activation=ExpertActivation("swiglu_oai", limit=1.5),
            biases=ExpertBiases(
                torch.randn(experts, 2 * inter, device=DEVICE).to(dtype),
                torch.randn(experts, hidden, device=DEVICE).to(dtype),
            ),
        )
    got = fused_experts(x, q13, q2, weights, ids, mxfp4=mx, backend="triton", **extra)
    want = fused_experts_ref(x, d13, d2, weights, ids, *extra.values())
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(
        fused_experts(x, q13, q2, weights, ids, mxfp4=mx, backend="torch", **extra),
        want,
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("dtype", [torch.float16, *([torch.bfloat16] if DEVICE == "cuda" else [])])
def test_the_scaled_dot_masks_a_last_partial_k_step(dtype):
    """bf16/fp16 activations take Triton's scaled dot, whose k-step need not divide K: 96 = 64 + 32 here,
    the last step masked by whole groups (bytes, scales and a's columns)."""
    from atom_kernels.moe.expert_gemm import TileConfig

    q13, q2, mx, d13, d2 = _mxfp4_experts(5, 96, 96, dtype)
    x = torch.randn(9, 96, device=DEVICE).to(dtype)
    ids = torch.rand(9, 5, device=DEVICE).topk(2, dim=-1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(9, 2, device=DEVICE), dim=-1)
    tile = TileConfig(16, 32, 64, group_m=2, num_warps=4 if DEVICE == "cuda" else 1, num_stages=2)
    got = fused_experts(x, q13, q2, weights, ids, mxfp4=mx, backend="triton", config=tile, down_config=tile)
    torch.testing.assert_close(
        got, fused_experts_ref(x, d13, d2, weights, ids), rtol=TOL[dtype], atol=TOL[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_token_gemv_decodes_every_byte_exactly(dtype):
    """The one-token GEMV (mxfp4_gemv.py; inline PTX on the GPU, Triton's integer ops under the
    interpreter): byte b of row r holds (r + 17 b) % 256, so a one-hot x picks out the low (even k) or the
    high (odd k) nibble of every byte value over the rows, a different one at each position of a word,
    under scales from 2**-20 to 2**13; the sums are exact in every dtype."""
    from atom_kernels.moe.expert_gemm import PairRows
    from atom_kernels.moe.mxfp4_gemv import _launch, gemv_config

    rows, k = 256, 96  # 96: a masked last k-step at the interpreter's 64 and the GPU's 256
    byte = torch.arange(rows, device=DEVICE)[:, None] + 17 * torch.arange(k // 2, device=DEVICE)[None, :]
    w = (byte % 256).to(torch.uint8)[None]
    scale = (107 + (torch.arange(rows * 3, device=DEVICE) % 34)).to(torch.uint8).reshape(1, rows, 3)
    want = dequantize_mxfp4(w[0], scale[0], torch.float32)  # [rows, k]
    ids = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    pairs = PairRows(ids, ids, ids, ids, 1, 1)
    cfg = gemv_config(interpret=DEVICE == "cpu")
    # every code position of a word (the PTX pairs codes j and j + 4 with shifts of their own), in the
    # first k-step and in the masked last one
    for col in (*range(8), 64, 95):
        x = torch.zeros(1, k, device=DEVICE, dtype=dtype)
        x[0, col] = 1
        out = torch.empty(1, rows, device=DEVICE, dtype=torch.float32)
        _launch(
            x, w, scale, out, pairs, rows, k, cfg, gated=False, weighted=False, bias=None, activation=SILU
        )
        torch.testing.assert_close(out[0], want[:, col], rtol=0, atol=0)


def test_the_shapes_above_reach_both_mxfp4_paths():
    """The reference test's shapes cover the GEMVs and the tile GEMMs as their lists say: a change of
    gemv_takes must not leave either path untested."""
    from atom_kernels.moe.mxfp4_gemv import gemv_takes

    def shape(case):
        return case.values if hasattr(case, "values") else case

    assert all(gemv_takes(*(shape(c)[i] for i in (0, 2, 1))) for c in GEMV_SHAPES)
    assert not any(gemv_takes(*(shape(c)[i] for i in (0, 2, 1))) for c in TILE_SHAPES)


def test_a_tile_asked_for_one_token_runs_the_pair_tiles(monkeypatch):
    """A config (benchmark sweeps) sends one token to the tile kernels, one tile a pair, not the GEMVs."""
    from atom_kernels.moe import fused
    from atom_kernels.moe.expert_gemm import TileConfig, tile_config
    from atom_kernels.settings import SETTINGS

    def no_gemv(*args, **kwargs):
        raise AssertionError("a tile was asked for, and the GEMVs ran")

    monkeypatch.setattr(fused, "mxfp4_gemv_experts", no_gemv)

    q13, q2, mx, d13, d2 = _mxfp4_experts(4, 64, 32, torch.float32)
    x = torch.randn(1, 64, device=DEVICE)
    ids = torch.tensor([[3, 1]], dtype=torch.int32, device=DEVICE)
    weights = torch.softmax(torch.randn(1, 2, device=DEVICE), dim=-1)
    # the ordering's rows a tile as fused_experts picks them (fp32 takes 32-row tiles on the GPU)
    block_m = tile_config(2, 4, 4, interpret=SETTINGS.triton_interpret, one_token=True).block_m
    tile = TileConfig(block_m, 32, 32, group_m=1, num_warps=4 if DEVICE == "cuda" else 1, num_stages=2)
    for given in (dict(config=tile), dict(down_config=tile)):
        got = fused_experts(x, q13, q2, weights, ids, mxfp4=mx, backend="triton", **given)
        torch.testing.assert_close(
            got, fused_experts_ref(x, d13, d2, weights, ids), rtol=TOL[torch.float32], atol=TOL[torch.float32]
        )


def test_the_gemv_refuses_weights_off_its_alignment():
    """The kernel promises Triton 16-byte rows (tl.multiple_of): a view that breaks it is named."""
    from atom_kernels.moe.expert_gemm import PairRows
    from atom_kernels.moe.mxfp4_gemv import GemvConfig, _launch

    rows, k = 16, 64
    shifted = torch.zeros(rows * k // 2 + 4, dtype=torch.uint8, device=DEVICE)[4:].view(1, rows, k // 2)
    scale = torch.full((1, rows, k // 32), 127, dtype=torch.uint8, device=DEVICE)
    ids = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out = torch.empty(1, rows, device=DEVICE)
    with pytest.raises(ValueError, match="must start on 16 bytes"):
        _launch(
            torch.ones(1, k, device=DEVICE), shifted, scale, out, PairRows(ids, ids, ids, ids, 1, 1), rows, k,
            GemvConfig(16, 64, 1), gated=False, weighted=False, bias=None, activation=SILU,
        )  # fmt: skip
    with pytest.raises(ValueError, match="power of two >= 32"):
        GemvConfig(16, 48, 4)


def test_the_k_step_divides_k_in_whole_groups():
    assert mxfp4_block_k(128, 2880) == 64 and mxfp4_block_k(32, 96) == 32 and mxfp4_block_k(128, 4096) == 128


def test_bad_mxfp4_inputs_are_named():
    q13, q2, mx, _, _ = _mxfp4_experts(4, 64, 32, torch.float32)
    x, weights = torch.randn(3, 64, device=DEVICE), torch.ones(3, 2, device=DEVICE)
    ids = torch.zeros(3, 2, dtype=torch.int32, device=DEVICE)
    ids[:, 1] = 1
    with pytest.raises(ValueError, match=r"w13 scales must be uint8 \(4, 64, 2\)"):
        fused_experts(x, q13, q2, weights, ids, mxfp4=ExpertMxfp4(mx.w13[..., :1].contiguous(), mx.w2))
    with pytest.raises(ValueError, match="w2 scales must be uint8"):
        fused_experts(x, q13, q2, weights, ids, mxfp4=ExpertMxfp4(mx.w13, mx.w2.float()))
    with pytest.raises(ValueError, match="MXFP4 w13 must be uint8"):
        fused_experts(x, q13.view(torch.int8), q2, weights, ids, mxfp4=mx)
    with pytest.raises(ValueError, match="weight-only"):
        fused_experts(x, q13, q2, weights, ids, mxfp4=mx, quantize_input=True, backend="triton")


@pytest.mark.gpu(reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("tokens", [1, 16])  # one token: the GEMVs; 16: the ordering kernel and tiles
def test_mxfp4_experts_captured_in_a_cuda_graph_with_new_routing_each_replay(tokens, backend):
    """GPT-OSS's decode graphs: MXFP4 experts with biases and the clamped SwiGLU captured once, then
    replayed over new inputs and routing (the torch backend dequantizes inside the capture)."""
    experts, k, hidden, inter = 16, 4, 256, 128
    q13, q2, mx, d13, d2 = _mxfp4_experts(experts, hidden, inter, torch.bfloat16)
    common = dict(
        activation=ExpertActivation("swiglu_oai", alpha=1.702, limit=7.0),
        biases=ExpertBiases(
            0.1 * torch.randn(experts, 2 * inter, device=DEVICE).bfloat16(),
            0.1 * torch.randn(experts, hidden, device=DEVICE).bfloat16(),
        ),
    )
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)
    ids = torch.rand(tokens, experts, device=DEVICE).topk(k, dim=-1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, device=DEVICE), dim=-1)
    out = torch.empty_like(x)
    run = lambda: fused_experts(x, q13, q2, weights, ids, mxfp4=mx, backend=backend, out=out, **common)  # noqa: E731
    run()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(2):
        ids.copy_(torch.rand(tokens, experts, device=DEVICE).topk(k, dim=-1).indices.to(torch.int32))
        weights.copy_(torch.softmax(torch.randn(tokens, k, device=DEVICE), dim=-1))
        x.copy_(torch.randn_like(x))
        graph.replay()
        want = fused_experts_ref(x, d13, d2, weights, ids, *common.values())
        # The clamped SwiGLU's intermediates reach ~50 here (bf16 steps of 0.25 there) and each expert's row
        # is rounded to bf16 before the rows are summed: an output that cancels its rows keeps their
        # rounding, so bf16's 3e-2 is taken of the outputs' scale, not of each element.
        scale = want.abs().max().item()
        torch.testing.assert_close(out, want, rtol=3e-2, atol=3e-2 * max(1.0, scale))
        if backend == "triton":  # the replay runs the eager call's kernels: its very output
            eager = fused_experts(x, q13, q2, weights, ids, mxfp4=mx, backend=backend, **common)
            assert torch.equal(out, eager)
