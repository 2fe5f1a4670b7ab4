import pytest
import torch

from atom_kernels import silu_and_mul
from atom_kernels.activation.ref import silu_and_mul_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The CPU interpreter's bf16 math is wrong: bf16 runs on the GPU only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "inter"), [(1, 8), (7, 48), (5, 1500), (33, 64)])
def test_matches_reference_and_writes_every_element(tokens, inter, dtype):
    x = torch.randn(tokens, 2 * inter, dtype=dtype, device=DEVICE) * 3
    out = _poisoned((tokens, inter), dtype)
    got = silu_and_mul(x, out=out, backend="triton")
    assert got.data_ptr() == out.data_ptr()
    assert not torch.isnan(got).any(), "some output elements were never written"
    torch.testing.assert_close(got, silu_and_mul_ref(x), rtol=TOL[dtype], atol=TOL[dtype])


def test_reference_is_the_textbook_formula():
    x = torch.randn(4, 6, dtype=torch.float64)
    gate, up = x[:, :3], x[:, 3:]
    expected = gate * torch.sigmoid(gate) * up
    torch.testing.assert_close(silu_and_mul_ref(x), expected)


def test_strided_rows_and_torch_backend_agree():
    base = torch.randn(9, 80, device=DEVICE)
    x = base[:, :64]  # row stride 80, last dim contiguous
    triton_out = silu_and_mul(x, backend="triton")
    torch_out = silu_and_mul(x, backend="torch")
    torch.testing.assert_close(triton_out, torch_out, rtol=1e-5, atol=1e-5)


def test_empty_batch():
    assert silu_and_mul(torch.randn(0, 16, device=DEVICE), backend="triton").shape == (0, 8)


@pytest.mark.parametrize(("shape", "message"), [((4, 7), r"\[T, 2\*I\]"), ((2, 3, 8), r"\[T, 2\*I\]")])
def test_bad_shapes_are_named(shape, message):
    with pytest.raises(ValueError, match=message):
        silu_and_mul(torch.randn(*shape, device=DEVICE))


def test_wrong_out_is_refused():
    x = torch.randn(4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="out must be"):
        silu_and_mul(x, out=torch.empty(4, 9, device=DEVICE))
