"""RMSNorm (plain, residual-fused, Gemma's 1 + w): the Triton kernel against the torch reference, and the
reference against the textbook formula."""

import pytest
import torch

from atom_kernels.norm import rms_norm
from atom_kernels.norm.ref import rms_norm_ref

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def test_reference_is_the_textbook_formula():
    # float64 inputs, fp32 statistics (as the models compute them): fp32 tolerances
    torch.manual_seed(0)
    x, w = torch.randn(5, 48, dtype=torch.float64), torch.randn(48, dtype=torch.float64)
    r = torch.randn(5, 48, dtype=torch.float64)
    want = w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    fp32 = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rms_norm_ref(x, w, 1e-6), want, **fp32)
    torch.testing.assert_close(rms_norm_ref(x, w, 1e-6, weight_offset=1.0), (1 + w) * want / w, **fp32)
    y, s = rms_norm_ref(x, w, 1e-6, r)
    torch.testing.assert_close(s, x + r, rtol=0, atol=0)
    torch.testing.assert_close(y, rms_norm_ref(x + r, w, 1e-6), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [48, 128, 4096 if GPU else 1000])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_triton_equals_reference(dtype, hidden, residual, offset):
    tokens = 7
    base = torch.randn(tokens, 2 * hidden, device=DEVICE).to(dtype)
    x = base[:, :hidden]  # strided rows
    res = torch.randn(tokens, hidden, device=DEVICE).to(dtype) if residual else None
    w = (torch.rand(hidden, device=DEVICE) + 0.5).to(dtype)
    x_before, res_before = x.clone(), res.clone() if residual else None
    out = torch.full((tokens, hidden), float("nan"), device=DEVICE, dtype=dtype)
    got = rms_norm(x, w, 1e-5, res, weight_offset=offset, out=out, backend="triton")
    want = rms_norm_ref(x, w, 1e-5, res, weight_offset=offset)
    if residual:
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)  # the sum: exactly x + residual
        got, want = got[0], want[0]
        torch.testing.assert_close(res, res_before, rtol=0, atol=0)  # inputs untouched
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(got).any()
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)


def test_torch_backend_and_empty_batch():
    x, w = torch.randn(3, 64, device=DEVICE), torch.ones(64, device=DEVICE)
    torch.testing.assert_close(rms_norm(x, w, 1e-6, backend="torch"), rms_norm_ref(x, w, 1e-6))
    assert rms_norm(x[:0], w, 1e-6, backend="triton").shape == (0, 64)


@pytest.mark.parametrize(
    ("x", "w", "res", "message"),
    [
        (torch.zeros(2, 3, 8), torch.ones(8), None, "x \\[T, H\\]"),
        (torch.zeros(2, 8), torch.ones(4), None, "weight \\[H\\]"),
        (torch.zeros(8, 2).t(), torch.ones(8), None, "contiguous"),
        (torch.zeros(2, 8), torch.ones(8), torch.zeros(3, 8), "residual must be like x"),
    ],
)
def test_bad_inputs_are_named(x, w, res, message):
    with pytest.raises(ValueError, match=message):
        rms_norm(x, w, 1e-6, res)
