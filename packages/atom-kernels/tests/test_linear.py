import pytest
import torch
import torch.nn.functional as F

from atom_kernels.linear import MAX_SKINNY_ROWS, linear
from atom_kernels.linear.ref import linear_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The CPU interpreter's bf16 math is wrong: bf16 runs on the GPU only.
DTYPES = [torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _operands(rows, n, k, dtype, *, gated=False, bias=False):
    x = torch.randn(rows, 2 * k if gated else k, dtype=dtype, device=DEVICE)
    w = torch.randn(n, k, dtype=dtype, device=DEVICE) / k**0.5
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    return x, w, b


def _assert_close(got, want, dtype):
    # fp32 accumulation in both; the output's rounding is the error that remains.
    torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17, MAX_SKINNY_ROWS])
@pytest.mark.parametrize(("n", "k"), [(64, 512), (37, 200), (130, 1024), (8, 40), (2056, 64), (40, 2048)])
def test_matches_reference(rows, n, k, dtype):
    """n <= NARROW_N takes the four-row GEMV tiles at one row, 2056 the eight-row ones; past one row
    40 x 2048 (one tile of 64 rows over a long K) is cut in two along K."""
    x, w, _ = _operands(rows, n, k, dtype)
    got = linear(x, w, backend="triton")
    assert got.shape == (rows, n) and got.dtype == dtype
    _assert_close(got, linear_ref(x, w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize(("n", "k"), [(48, 256), (21, 72)])
def test_gated_input_and_bias(rows, n, k, dtype):
    x, w, b = _operands(rows, n, k, dtype, gated=True, bias=True)
    got = linear(x, w, b, gated_input=True, backend="triton")
    _assert_close(got, linear_ref(x, w, b, gated_input=True), dtype)
    # The fusion equals the two-kernel path it replaces: silu_and_mul, then the matmul.
    gate, up = x.float().chunk(2, dim=-1)
    two_step = F.linear((F.silu(gate) * up).to(dtype).float(), w.float(), b.float())
    _assert_close(got, two_step, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 17, MAX_SKINNY_ROWS + 1])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_fp32_output_keeps_the_unrounded_sums(rows, dtype, backend):
    """out_dtype=float32 is the product of fp32 copies of x and the weight (a router's logits): sums not
    rounded to x's dtype (the kernels at 64 rows or fewer, torch past that or when asked)."""
    x, w, b = _operands(rows, 72, 256, dtype, bias=True)
    got = linear(x, w, b, out_dtype=torch.float32, backend=backend)
    assert got.dtype == torch.float32 and got.shape == (rows, 72)
    want = F.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - want).abs().max() < (linear(x, w, b, backend=backend).float() - want).abs().max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_sigmoid_gate_scales_the_input_as_torch_does(rows, dtype, backend):
    """sigmoid_gate: the attention output times its per-head gate, the gate left inside the projection's
    [T, H, 2D] output (q | gate per head): equal to `x * torch.sigmoid(gate)` then the matmul, rounded
    alike (fused in the one-row kernel, torch otherwise)."""
    heads, d, n = 4, 32, 48
    x, w, b = _operands(rows, n, heads * d, dtype, bias=True)
    projected = torch.randn(rows, heads, 2 * d, dtype=dtype, device=DEVICE)
    gate = projected[..., d:]  # [rows, H, D], heads 2D apart
    got = linear(x, w, b, sigmoid_gate=gate, backend=backend)
    scaled = x * torch.sigmoid(gate.reshape(rows, heads * d))
    _assert_close(got, linear_ref(scaled, w, b), dtype)
    with pytest.raises(ValueError, match="sigmoid_gate"):
        linear(x, w, sigmoid_gate=gate[..., :-1], backend=backend)


def test_an_output_dtype_other_than_x_or_fp32_is_refused():
    x, w, _ = _operands(1, 8, 16, torch.float16)
    with pytest.raises(ValueError, match=r"out_dtype must be x's dtype or torch\.float32"):
        linear(x, w, out_dtype=torch.bfloat16)


def test_leading_dims_and_strided_rows():
    base = torch.randn(2, 3, 96, dtype=torch.float16, device=DEVICE)
    x = base[..., :64]  # rows 96 apart, last dim contiguous
    w = torch.randn(24, 64, dtype=torch.float16, device=DEVICE) / 8
    got = linear(x, w, backend="triton")
    assert got.shape == (2, 3, 24)
    _assert_close(got, linear_ref(x.reshape(6, 64), w).view(2, 3, 24), torch.float16)


def test_reference_is_the_textbook_formula():
    # fp32 inputs: the reference works in fp32 (float64 inputs came back within fp32 rounding of the
    # float64 formula, which float64's default tolerance refused now and then)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 10, generator=gen)
    w, b = torch.randn(4, 5, generator=gen), torch.randn(4, generator=gen)
    gate, up = x[:, :5].double(), x[:, 5:].double()
    expected = (gate * torch.sigmoid(gate) * up) @ w.double().T + b.double()
    torch.testing.assert_close(linear_ref(x, w, b, gated_input=True), expected.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [MAX_SKINNY_ROWS + 1, 100])
def test_many_rows_and_other_backends_agree(rows):
    # Past MAX_SKINNY_ROWS (and for fp32, or with the torch backend) the call is torch's matmul.
    for dtype in (torch.float16, torch.float32):
        x, w, b = _operands(rows, 24, 48, dtype, gated=True, bias=True)
        want = linear_ref(x, w, b, gated_input=True)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype is torch.float32 else dict(rtol=2e-3, atol=2e-3)
        for backend in ("triton", "torch"):
            got = linear(x, w, b, gated_input=True, backend=backend)
            torch.testing.assert_close(got.float(), want.float(), **tol)


def test_gated_run_is_one_row_only():
    from atom_kernels.linear.skinny import run_skinny, skinny_tiles

    x, w, _ = _operands(2, 16, 32, torch.float16, gated=True)
    with pytest.raises(ValueError, match="one row only"):
        run_skinny(
            x,
            w,
            None,
            torch.empty(2, 16, dtype=torch.float16, device=DEVICE),
            gated_input=True,
            tiles=skinny_tiles(2, 32),
        )


@pytest.mark.parametrize("rows", [2, 17, 64])
@pytest.mark.parametrize(("n", "k", "splits"), [(70, 300, 3), (32, 512, 8), (130, 96, 2)])
def test_split_k_sums_in_one_launch(rows, n, k, splits):
    """K cut over programs: the last program of each output tile sums the partials (split_k.py), adds the
    bias once, and leaves the tile counters at zero for the next launch; the sum runs in split order, so
    a second launch gives the same bits."""
    from atom_kernels.linear.skinny import SkinnyTiles, run_skinny
    from atom_kernels.tile_tickets import tile_counters

    x, w, b = _operands(rows, n, k, torch.float16, bias=True)
    tiles = SkinnyTiles(64, 32, 4, 2, splits)
    counters = tile_counters(x.device, 1)
    outs = []
    for _ in range(2):
        y = torch.full((rows, n), float("nan"), dtype=torch.float16, device=DEVICE)
        run_skinny(x, w, b, y, gated_input=False, tiles=tiles)
        assert int(counters.abs().sum()) == 0
        outs.append(y)
    _assert_close(outs[0], linear_ref(x, w, b), torch.float16)
    assert torch.equal(outs[0], outs[1])


def test_split_k_tiles_for_narrow_long_weights():
    from atom_kernels.linear.skinny import skinny_tiles

    # Llama-3-8B's down projection (4096 x 14336) at a few rows to 64: too few 64-row tiles alone
    for rows in (2, 16, 64):
        assert skinny_tiles(rows, 14336, 4096).splits > 1
    # a vocabulary-wide head has tiles enough for every SM: never cut
    assert skinny_tiles(64, 4096, 128256).splits == 1


@pytest.mark.gpu(reason="CUDA graphs need a GPU")
def test_split_k_replays_in_a_cuda_graph():
    """The counters go back to zero inside each launch, so replays of a captured split launch stay right."""
    x, w, _ = _operands(48, 4096, 14336, torch.bfloat16)
    static_x = x.clone()
    linear(static_x, w)  # compile and allocate outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = linear(static_x, w)
    for _ in range(3):
        static_x.copy_(torch.randn_like(x))
        graph.replay()
        _assert_close(static_y, linear_ref(static_x, w), torch.bfloat16)


def test_one_row_fp32_uses_torch_and_is_exact():
    x, w, b = _operands(1, 16, 32, torch.float32, bias=True)
    torch.testing.assert_close(linear(x, w, b, backend="triton"), F.linear(x, w, b))


def test_empty_batch():
    x, w, _ = _operands(0, 16, 32, torch.float16)
    assert linear(x, w, backend="triton").shape == (0, 16)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "bias_shape", "gated", "message"),
    [
        ((2, 30), (16, 32), None, False, r"x \[\.\.\., K\] with K=32"),
        ((2, 32), (16, 32), None, True, r"\[\.\.\., 2K\] \(gate then up\)"),
        ((2, 32), (16, 32, 1), None, False, r"weight \[N, K\]"),
        ((2, 32), (16, 32), (15,), False, r"bias \[16\]"),
    ],
)
def test_bad_shapes_are_named(x_shape, w_shape, bias_shape, gated, message):
    x = torch.randn(*x_shape, device=DEVICE)
    w = torch.randn(*w_shape, device=DEVICE)
    b = torch.randn(*bias_shape, device=DEVICE) if bias_shape else None
    with pytest.raises(ValueError, match=message):
        linear(x, w, b, gated_input=gated)


def test_mixed_dtypes_are_refused():
    with pytest.raises(ValueError, match="one dtype"):
        linear(torch.randn(1, 8, dtype=torch.float16), torch.randn(4, 8))
