import math

import pytest
import torch
import torch.nn.functional as F

from atom_kernels.activation import silu_and_mul
from atom_kernels.activation.ref import silu_and_mul_ref
from atom_kernels.fp8 import (
    E4M3,
    E4M3_MAX,
    cublas_blockwise,
    dequantize_weight_ref,
    fp8_linear,
    fp8_linear_ref,
    quantize_act,
    quantize_act_ref,
    quantize_weight_ref,
    scale_grid,
)
from atom_kernels.fp8.cublas_blockwise import cublas_blockwise_supported, cublas_w8a8
from atom_kernels.fp8.gemm import GemmTiles, w8a8_gemm
from atom_kernels.fp8.linear import quantizes_input
from atom_kernels.fp8.skinny_w8a8 import MAX_ROWS as SKINNY_W8A8_MAX_ROWS
from atom_kernels.fp8.skinny_w8a8 import SkinnyTiles, w8a8_skinny
from atom_kernels.fp8.stream import MAX_SKINNY_ROWS, run_stream
from atom_kernels.tile_tickets import tile_counters

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU = DEVICE == "cuda"
HOPPER = GPU and torch.version.cuda is not None and torch.cuda.get_device_capability() == (9, 0)
# The CPU interpreter's bf16 math is wrong: bf16 runs on the GPU only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
# Largest |error| allowed, relative to the output's largest |value|. fp32 outputs differ from the reference
# by fp32 rounding only, except that Hopper's fp8 MMA keeps ~14 bits while it sums one 128-deep group.
TOL = {torch.float32: 2e-3 if GPU else 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _weight(n, k, block, *, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) / k**0.5
    q, s = quantize_weight_ref(w, block)
    return q.to(DEVICE), s.to(DEVICE)


def _x(rows, k, dtype, *, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=gen).to(DEVICE, dtype)


def _bias(n, dtype):
    return torch.randn(n, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)


def _assert_close(got, want, dtype):
    err = (got.float() - want.float()).abs().max().item()
    bound = TOL[dtype] * want.float().abs().max().item()
    assert err <= bound, f"max |error| {err:.3g} > {bound:.3g} ({TOL[dtype]} of the output's scale)"


# --- the reference format ---


def test_scale_grid():
    assert scale_grid((256, 512), (128, 128)) == (2, 4)
    assert scale_grid((257, 100), (128, 128)) == (3, 1)
    assert scale_grid((7, 33), (1, 16)) == (7, 3)


@pytest.mark.parametrize(
    ("n", "k", "block"), [(64, 96, (16, 32)), (37, 100, (16, 32)), (130, 200, (128, 128))]
)
def test_weight_round_trip_within_half_an_e4m3_step(n, k, block):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
    w[:, :3] *= 40  # uneven tiles: large columns in some, not others
    q, s = quantize_weight_ref(w, block)
    assert q.dtype == E4M3 and q.shape == (n, k) and s.shape == scale_grid((n, k), block)
    # Each tile's absmax (ragged edge tiles: of the elements they have) maps to 448.
    for i, j in [(0, 0), (s.shape[0] - 1, s.shape[1] - 1)]:
        tile = w[i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]]
        assert s[i, j] == tile.abs().max() / E4M3_MAX
    amax = (s * E4M3_MAX).repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k]
    err = (dequantize_weight_ref(q, s, block) - w).abs()
    assert (err <= 2**-4 * amax).all()  # 3 mantissa bits: half a step is 2^-4 of the value at most


def test_zero_tile_gets_scale_one():
    w = torch.zeros(32, 32)
    w[16:, 16:] = torch.randn(16, 16)
    q, s = quantize_weight_ref(w, (16, 16))
    assert s[0, 0] == 1 and s[0, 1] == 1 and s[1, 0] == 1 and (q[:16].float() == 0).all()


# --- activation quantization ---

ACT_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize(("m", "k", "group"), [(5, 100, 32), (3, 128, 128), (9, 96, 48)])
def test_quantize_act_matches_reference_bit_for_bit(m, k, group, pow2, dtype):
    # Rows spanning magnitudes, one all-zero row (the 1e-4 floor) and a group of tiny values (subnormals).
    x = _x(m, k, torch.float32) * torch.logspace(-6, 3, m, device=DEVICE)[:, None]
    x[1] = 0
    x[-1, :group] *= 1e-3
    x = x.to(dtype)
    xq, xs = quantize_act(x, group, pow2_scales=pow2, backend="triton")
    rq, rs = quantize_act_ref(x, group, pow2_scales=pow2)
    assert xq.dtype == E4M3 and xq.shape == (m, k) and xs.shape == (m, math.ceil(k / group))
    assert torch.equal(xs, rs)
    # The kernel rounds to the e4m3 grid itself, so even the interpreter (whose own conversion is off) is exact.
    assert torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(("m", "pad"), [(5, 4), (8, 4), (3, 1), (0, 4)])
def test_quantize_act_token_major_padded_scales(m, pad, backend):
    """The layout cuBLAS's blockwise scaling reads: xs strides (1, M_pad), M rounded up to `pad`; rows
    below M hold quantize_act_ref's values exactly."""
    x = _x(m, 100, torch.float32) * 5
    xq, xs = quantize_act(x, 32, token_major_scales=True, pad_rows_to=pad, backend=backend)
    m_pad = -(-m // pad) * pad
    assert xq.shape == (m_pad, 100) and xs.shape == (m_pad, 4)
    assert xq.is_contiguous() and (m_pad == 0 or xs.stride() == (1, m_pad))
    rq, rs = quantize_act_ref(x, 32)
    assert torch.equal(xs[:m], rs)
    assert torch.equal(xq[:m].view(torch.uint8), rq.view(torch.uint8))
    with pytest.raises(ValueError, match="pad_rows_to"):
        quantize_act(x, 32, pad_rows_to=0)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_quantize_act_gated_input_is_silu_and_mul_then_quantize(dtype, backend):
    """The down projection's input formed inside the quantization: the same e4m3 values and scales as
    silu_and_mul (in x's dtype) followed by quantize_act, bit for bit."""
    gate_up = (_x(7, 2 * 80, torch.float32) * 4).to(dtype)
    xq, xs = quantize_act(gate_up, 32, gated_input=True, backend=backend)
    rq, rs = quantize_act(silu_and_mul(gate_up, backend=backend), 32, backend=backend)
    assert xq.shape == (7, 80) and xs.shape == (7, 3)
    assert torch.equal(xs, rs)
    assert torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))
    with pytest.raises(ValueError, match=r"\[M, 2K\]"):
        quantize_act(gate_up[:, :-1], 32, gated_input=True, backend=backend)


def test_quantize_act_rounds_every_e4m3_value_and_tie():
    grid = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
    grid = grid[grid.isfinite()].unique()
    ties = (grid[1:] + grid[:-1]) / 2  # ties go to the even neighbour, one ulp either side goes its way
    values = torch.cat([grid, ties, ties.nextafter(ties + 1), ties.nextafter(ties - 1)])
    x = torch.cat([torch.tensor([E4M3_MAX]), values, -values])[None].to(DEVICE)  # 448 in the group: xs = 1
    xq, xs = quantize_act(x, x.shape[1], backend="triton")
    rq, rs = quantize_act_ref(x, x.shape[1])
    assert xs.item() == rs.item() == 1.0
    assert torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))


def test_pow2_scales_are_powers_of_two_and_do_not_clip():
    x = _x(7, 80, torch.float32) * 3.7
    _, xs = quantize_act(x, 16, pow2_scales=True, backend="triton")
    mantissa, _ = torch.frexp(xs)
    assert (mantissa == 0.5).all()  # 2^e exactly
    amax = x.view(7, 5, 16).abs().amax(-1)
    assert (xs >= amax / E4M3_MAX).all()  # rounded up: x / xs stays inside [-448, 448]
    assert (xs < 2 * amax / E4M3_MAX).all()


def test_act_round_trip_within_half_an_e4m3_step():
    x = _x(6, 72, torch.float32)  # the last group of 16 has 8 channels
    xq, xs = quantize_act_ref(x, 16)
    back = xq.float() * xs.repeat_interleave(16, 1)[:, :72]
    amax = F.pad(x, (0, 8)).view(6, 5, 16).abs().amax(-1).repeat_interleave(16, 1)[:, :72]
    assert ((back - x).abs() <= 2**-4 * amax).all()


def test_quantize_act_empty_and_errors():
    xq, xs = quantize_act(torch.empty(0, 40, device=DEVICE), 16, backend="triton")
    assert xq.shape == (0, 40) and xs.shape == (0, 3)
    with pytest.raises(ValueError, match=r"x \[M, K\]"):
        quantize_act(torch.randn(2, 3, 4), 16)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        quantize_act(torch.randn(2, 16, dtype=torch.float64), 16)


# --- the W8A8 GEMM (activations from the torch reference: the comparison isolates the GEMM) ---

GEMM_CASES = [
    (33, 40, 72, (16, 16)),  # bk 16: zero-padded to the fp8 MMA's 32-deep step
    (20, 37, 100, (32, 16)),
    (17, 130, 200, (128, 128)),
    (40, 37, 128, (5, 64)),  # odd bn (several scale rows in a tile), K a multiple of bk (no k masks)
]
if GPU:
    GEMM_CASES += [(300, 520, 1000, (128, 128)), (1000, 1536, 1024, (128, 128)), (65, 700, 900, (64, 64))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k", "block"), GEMM_CASES)
def test_gemm_matches_reference(m, n, k, block, dtype):
    q, s = _weight(n, k, block)
    x, b = _x(m, k, dtype), _bias(n, dtype)
    xq, xs = quantize_act_ref(x, block[1])
    got = w8a8_gemm(xq, xs, q, s, block, b, out_dtype=dtype)
    assert got.shape == (m, n) and got.dtype == dtype
    _assert_close(got, fp8_linear_ref(x, q, s, block, b, quantize_input=True), dtype)


def test_gemm_grouped_order_covers_every_tile():
    # Tall grid with a partial last group of row tiles: every output tile is written once.
    q, s = _weight(70, 48, (16, 16))
    x = _x(50, 48, torch.float32)
    xq, xs = quantize_act_ref(x, 16)
    got = w8a8_gemm(xq, xs, q, s, (16, 16), out_dtype=torch.float32, tiles=GemmTiles(16, 16, group_m=3))
    _assert_close(got, fp8_linear_ref(x, q, s, (16, 16), quantize_input=True), torch.float32)


SKINNY_CASES = [
    (1, 40, 72, (16, 16)),
    (3, 130, 200, (128, 128)),
    (16, 37, 100, (32, 16)),
    (5, 40, 128, (5, 64)),
    (27, 40, 72, (16, 16)),  # 32-row MMA columns
    (SKINNY_W8A8_MAX_ROWS, 24, 64, (16, 32)),  # 64-row columns, full
]
if GPU:
    SKINNY_CASES += [
        (1, 6144, 4096, (128, 128)),
        (8, 576, 7168, (128, 128)),
        (16, 700, 900, (64, 64)),
        (40, 4096, 1024, (128, 128)),
        (64, 2112, 7168, (128, 128)),
    ]


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k", "block"), SKINNY_CASES)
def test_skinny_w8a8_matches_reference(m, n, k, block, dtype, split_k):
    """The operand-swapped W8A8 product for <= 64 rows, its k-steps in one program or split over three
    (the partials summed by each tile's last program, the bias added once, the tile counters left at 0)."""
    q, s = _weight(n, k, block)
    x, b = _x(m, k, dtype), _bias(n, dtype)
    xq, xs = quantize_act_ref(x, block[1])
    tiles = SkinnyTiles(
        64 if GPU else 16, split_k=split_k, num_warps=4 if GPU else 1, num_stages=4 if GPU else 1
    )
    got = w8a8_skinny(xq, xs, q, s, block, b, out_dtype=dtype, tiles=tiles)
    assert got.shape == (m, n) and got.dtype == dtype
    _assert_close(got, fp8_linear_ref(x, q, s, block, b, quantize_input=True), dtype)
    assert int(tile_counters(got.device, 1).abs().sum()) == 0


# --- fp8_linear: streaming at <= 16 rows, quantize_act + GEMM beyond ---

STREAM_SHAPES = [
    (40, 72, (16, 16)),
    (37, 100, (32, 16)),
    (130, 200, (128, 128)),
    (48, 256, (32, 64)),  # K a multiple of the step: no k masks
    (20, 200, (5, 96)),  # bk 96: 32-channel segments still have one scale per row
    (24, 72, (7, 24)),  # bk 24: per-element scales, the dequantized tile rounded to x's dtype
]
if GPU:
    STREAM_SHAPES += [(1000, 4000, (128, 128)), (576, 7168, (128, 128)), (300, 1000, (96, 96))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, MAX_SKINNY_ROWS])
@pytest.mark.parametrize(("n", "k", "block"), STREAM_SHAPES)
def test_few_rows_quantize_x_or_stream_the_weight(rows, n, k, block, dtype):
    """fp8_linear at <= 16 rows: W8A8 (x quantized) where quantizes_input says so, else weight-only; the
    weight-only streaming kernels themselves at every row count."""
    q, s = _weight(n, k, block)
    x, b = _x(rows, k, dtype), _bias(n, dtype)
    got = fp8_linear(x, q, s, block, b, backend="triton")
    assert got.shape == (rows, n) and got.dtype == dtype
    w8a8 = quantizes_input(rows, n, k, block[1])
    assert w8a8 == (rows > 1 and block[1] in (16, 32, 64, 128))  # these weights are all small
    _assert_close(got, fp8_linear_ref(x, q, s, block, b, quantize_input=w8a8), dtype)
    streamed = torch.empty(rows, n, dtype=dtype, device=DEVICE)
    run_stream(x, q, s, block, b, streamed)
    _assert_close(streamed, fp8_linear_ref(x, q, s, block, b), dtype)


def test_one_row_of_a_large_weight_quantizes_x(monkeypatch):
    from atom_kernels.fp8 import linear

    q, s = _weight(130, 200, (128, 128))
    x = _x(1, 200, torch.float32)
    assert not quantizes_input(1, 130, 200, 128)
    monkeypatch.setattr(linear, "GEMV_MAX_ELEMENTS", 130 * 200)  # as if this weight were large
    assert quantizes_input(1, 130, 200, 128)
    got = fp8_linear(x, q, s, (128, 128), backend="triton")
    _assert_close(got, fp8_linear_ref(x, q, s, (128, 128), quantize_input=True), torch.float32)


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_many_rows_quantize_then_gemm(dtype, pow2):
    q, s = _weight(40, 96, (32, 32))
    x = _x(SKINNY_W8A8_MAX_ROWS + 3, 96, dtype)
    got = fp8_linear(x, q, s, (32, 32), pow2_scales=pow2, backend="triton")
    want = fp8_linear_ref(x, q, s, (32, 32), quantize_input=True, pow2_scales=pow2)
    _assert_close(got, want, dtype)


@pytest.mark.parametrize("rows", [1, 5, SKINNY_W8A8_MAX_ROWS + 3])
def test_gated_input_is_the_down_projection_of_silu_and_mul(rows):
    """fp8_linear(gate_up, gated_input=True) on every path (weight-only at one row of a small weight,
    skinny W8A8, the GEMM) equals the layer applied to silu_and_mul's output."""
    q, s = _weight(40, 96, (32, 32))
    gate_up = _x(rows, 192, torch.float16)
    got = fp8_linear(gate_up, q, s, (32, 32), backend="triton", gated_input=True)
    want = fp8_linear(silu_and_mul(gate_up, backend="triton"), q, s, (32, 32), backend="triton")
    assert got.shape == (rows, 40)
    assert torch.equal(got, want)
    ref = fp8_linear_ref(silu_and_mul_ref(gate_up), q, s, (32, 32), quantize_input=rows > 1)
    _assert_close(got, ref, torch.float16)
    torch_path = fp8_linear(gate_up, q, s, (32, 32), backend="torch", gated_input=True)
    _assert_close(torch_path, fp8_linear_ref(silu_and_mul_ref(gate_up), q, s, (32, 32)), torch.float16)
    with pytest.raises(ValueError, match=r"\[\.\.\., 2K\] \(gate then up\) with 2K=192"):
        fp8_linear(gate_up[:, :96], q, s, (32, 32), gated_input=True)


def test_leading_dims_strided_rows_and_empty():
    q, s = _weight(24, 64, (16, 32))
    base = _x(6, 96, torch.float16).view(2, 3, 96)
    x = base[..., :64]  # rows 96 apart, last dim contiguous
    got = fp8_linear(x, q, s, (16, 32), backend="triton")
    assert got.shape == (2, 3, 24)
    want = fp8_linear_ref(x.reshape(6, 64), q, s, (16, 32), quantize_input=True)  # 6 rows: W8A8
    _assert_close(got, want.view(2, 3, 24), torch.float16)
    assert fp8_linear(x[:, :0], q, s, (16, 32), backend="triton").shape == (2, 0, 24)


def test_torch_backend_and_cpu_default_are_the_reference():
    q, s = _weight(24, 64, (16, 32))
    x, b = _x(20, 64, torch.float32), _bias(24, torch.float32)
    want = fp8_linear_ref(x, q, s, (16, 32), b)
    assert torch.equal(fp8_linear(x, q, s, (16, 32), b, backend="torch"), want)
    if not GPU:  # on the CPU the interpreter runs only when asked for
        assert torch.equal(fp8_linear(x, q, s, (16, 32), b), want)


def _case(**change):
    args = dict(x=torch.randn(2, 64), weight=torch.zeros(24, 64).to(E4M3), scale=torch.ones(2, 2))
    args.update(change)
    return args


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(scale=torch.ones(2, 3)), r"scale \[2, 2\] \(ceil\(N/16\), ceil\(K/32\)\) .* got \(2, 3\)"),
        (dict(scale=torch.ones(2, 2, dtype=torch.bfloat16)), r"float32 scale .* got torch\.bfloat16"),
        (dict(weight=torch.zeros(24, 64)), r"float8_e4m3fn weight, got torch\.float32"),
        (dict(weight=torch.zeros(24, 64, 1).to(E4M3)), r"weight \[N, K\]"),
        (dict(x=torch.randn(2, 60)), r"x \[\.\.\., K\] with K=64"),
        (
            dict(x=torch.randn(2, 64, dtype=torch.float64)),
            r"float16, bfloat16 or float32, got torch\.float64",
        ),
        (dict(bias=torch.zeros(23)), r"bias \[24\], got \(23,\)"),
    ],
)
def test_bad_arguments_are_named(change, message):
    args = _case(**change)
    with pytest.raises(ValueError, match=message):
        fp8_linear(args.pop("x"), args.pop("weight"), args.pop("scale"), (16, 32), **args)


def test_gemm_needs_a_power_of_two_block_k():
    q, s = _weight(24, 72, (8, 24))
    fp8_linear(_x(MAX_SKINNY_ROWS, 72, torch.float32), q, s, (8, 24), backend="triton")  # streaming: fine
    with pytest.raises(ValueError, match=r"power of two >= 16, got block_k=24"):
        fp8_linear(_x(MAX_SKINNY_ROWS + 1, 72, torch.float32), q, s, (8, 24), backend="triton")


@pytest.mark.parametrize("k", [256, 200])  # whole steps, and a ragged last step
def test_skinny_steps_of_several_scale_segments(k):
    from atom_kernels.fp8.stream import StreamTiles

    q, s = quantize_weight_ref(torch.randn(48, k, device=DEVICE), (16, 32))
    x = torch.randn(5, k, device=DEVICE, dtype=torch.float16)
    y = torch.empty(5, 48, device=DEVICE, dtype=torch.float16)
    run_stream(x, q, s, (16, 32), None, y, tiles=StreamTiles(16, 32, 2, True, 4, 1))
    torch.testing.assert_close(y.float(), fp8_linear_ref(x, q, s, (16, 32)).float(), rtol=2e-3, atol=2e-3)


# --- cuBLAS's blockwise-scaled GEMM (Hopper): the checkpoints' 128x128 format at prefill's rows ---


def test_cublas_blockwise_takes_only_the_format_it_runs():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert not cublas_blockwise_supported(4096, 4096, (128, 128), torch.bfloat16, cpu)
    # the shape rules hold before any GPU is asked about
    assert not cublas_blockwise_supported(4096, 4096, (64, 64), torch.bfloat16, gpu)
    assert not cublas_blockwise_supported(4096, 4000, (128, 128), torch.bfloat16, gpu)  # K % 128
    assert not cublas_blockwise_supported(4096, 1152, (128, 128), torch.bfloat16, gpu)  # 9 scale columns
    assert not cublas_blockwise_supported(4100, 4096, (128, 128), torch.bfloat16, gpu)  # N % 16
    assert not cublas_blockwise_supported(4096, 4096, (128, 128), torch.float32, gpu)
    if HOPPER:
        assert cublas_blockwise_supported(576, 7168, (128, 128), torch.bfloat16, gpu)


CUBLAS_CASES = [(17, 576, 7168), (65, 2112, 512), (300, 1024, 1536), (1000, 1536, 1024)]


@pytest.mark.sm90(reason="cuBLAS's blockwise fp8 scaling runs on sm90 GPUs only")
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n", "k"), CUBLAS_CASES)
def test_cublas_w8a8_matches_reference(m, n, k, dtype, bias):
    """Ragged N (576, 2112: half a scale block), rows not a multiple of 4 (padded), bias added after."""
    q, s = _weight(n, k, (128, 128))
    x, b = _x(m, k, dtype), _bias(n, dtype) if bias else None
    got = cublas_w8a8(x, q, s, b)
    assert got.shape == (m, n) and got.dtype == dtype and got.is_contiguous()
    _assert_close(got, fp8_linear_ref(x, q, s, (128, 128), b, quantize_input=True), dtype)


@pytest.mark.sm90(reason="cuBLAS's blockwise fp8 scaling runs on sm90 GPUs only")
def test_cublas_w8a8_gated_input_quantizes_silu_and_mul():
    q, s = _weight(1024, 512, (128, 128))
    gate_up = _x(70, 1024, torch.bfloat16)
    got = cublas_w8a8(gate_up, q, s, gated_input=True)
    assert torch.equal(got, cublas_w8a8(silu_and_mul(gate_up), q, s))


@pytest.mark.sm90(reason="cuBLAS's blockwise fp8 scaling runs on sm90 GPUs only")
def test_fp8_linear_takes_cublas_past_the_skinny_rows(monkeypatch):
    calls = []
    real = cublas_blockwise.cublas_w8a8
    monkeypatch.setattr(
        "atom_kernels.fp8.linear.cublas_w8a8", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw)
    )
    q, s = _weight(1024, 512, (128, 128))
    for rows in (SKINNY_W8A8_MAX_ROWS, SKINNY_W8A8_MAX_ROWS + 1):
        x = _x(rows, 512, torch.bfloat16)
        got = fp8_linear(x, q, s, (128, 128))
        _assert_close(got, fp8_linear_ref(x, q, s, (128, 128), quantize_input=True), torch.bfloat16)
    assert calls == [(SKINNY_W8A8_MAX_ROWS + 1, 512)]
    q, s = _weight(1024, 512, (64, 64))  # another block: the Triton GEMM
    fp8_linear(_x(100, 512, torch.bfloat16), q, s, (64, 64))
    assert len(calls) == 1
