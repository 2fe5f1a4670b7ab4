"""Gated RMSNorm (GDN output norm) against the torch reference and transformers' Qwen3.5 module."""

import pytest
import torch

from atom_kernels import rms_norm_gated
from atom_kernels.norm.ref import rms_norm_gated_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "dim"), [(1, 128), (67, 128), (13, 96), (5, 256), (300, 64)])
def test_matches_reference_and_writes_every_element(rows, dim, dtype):
    x = (torch.randn(rows, dim, device=DEVICE) * 2).to(dtype)
    gate = torch.randn(rows, dim, device=DEVICE).to(dtype)
    weight = (torch.rand(dim, device=DEVICE) + 0.5).to(dtype)
    out = torch.full((rows, dim), float("nan"), dtype=dtype, device=DEVICE)
    got = rms_norm_gated(x, gate, weight, 1e-6, out=out, backend="triton")
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(got).any()
    torch.testing.assert_close(
        got, rms_norm_gated_ref(x, gate, weight, 1e-6), rtol=TOL[dtype], atol=TOL[dtype]
    )


def test_reference_equals_transformers_qwen3_5_gated_norm():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    module = Qwen3_5RMSNormGated(64, eps=1e-6).to(DEVICE)
    module.weight.data.uniform_(0.5, 1.5)
    x, gate = torch.randn(2, 7, 4, 64, device=DEVICE), torch.randn(2, 7, 4, 64, device=DEVICE)
    want = module(x, gate)
    got = rms_norm_gated(x.reshape(-1, 64), gate.reshape(-1, 64), module.weight, 1e-6, backend="triton")
    torch.testing.assert_close(got.view_as(want), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        rms_norm_gated_ref(x.reshape(-1, 64), gate.reshape(-1, 64), module.weight, 1e-6), want.reshape(-1, 64)
    )


def test_strided_rows_and_torch_backend_agree():
    base = torch.randn(9, 2, 128, device=DEVICE)
    x, gate = base[:, 0], base[:, 1]  # row stride 256
    weight = torch.rand(128, device=DEVICE)
    torch.testing.assert_close(
        rms_norm_gated(x, gate, weight, 1e-5, backend="triton"),
        rms_norm_gated(x, gate, weight, 1e-5, backend="torch"),
        rtol=1e-5,
        atol=1e-5,
    )
    assert rms_norm_gated(x[:0], gate[:0], weight, 1e-5, backend="triton").shape == (0, 128)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((4, 8), (4, 9), (8,)), r"x and gate \[N, D\]"),
        (((4, 8), (4, 8), (7,)), r"weight \[D\]"),
        (((2, 4, 8), (2, 4, 8), (8,)), r"x and gate \[N, D\]"),
    ],
)
def test_bad_shapes_are_named(shapes, message):
    x, gate, weight = (torch.randn(*s, device=DEVICE) for s in shapes)
    with pytest.raises(ValueError, match=message):
        rms_norm_gated(x, gate, weight, 1e-6)
