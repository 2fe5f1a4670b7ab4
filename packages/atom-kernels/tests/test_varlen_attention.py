"""Causal attention of fresh packed sequences (MLA's un-absorbed prefill) against a float64 softmax."""

import pytest
import torch

from atom_kernels.attention import varlen_causal_attention

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# DeepSeek's q/k 192 and v 128 on the GPU; narrower on the CPU interpreter, same code path.
WIDTHS = (192, 128) if GPU else (24, 16)
TOL = {torch.float32: 2e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _expected(q, k, v, lens, scale):
    out, start = [], 0
    for n in lens:
        qs, ks, vs = (x[start : start + n].double().transpose(0, 1) for x in (q, k, v))
        s = qs @ ks.transpose(1, 2) * scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        out.append((s.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else []))
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("lens", [[5, 17, 1, 9], [40]] + ([[300, 77, 1000]] if GPU else []))
def test_matches_a_float64_softmax(lens, backend, dtype):
    torch.manual_seed(0)
    width, v_width = WIDTHS
    tokens, heads = sum(lens), 3
    q, k = (torch.randn(tokens, heads, width, device=DEVICE).to(dtype) for _ in range(2))
    v = torch.randn(tokens, heads, v_width, device=DEVICE).to(dtype)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    got = varlen_causal_attention(
        q, k, v, cu_seqlens=cu, max_seq_len=max(lens), softmax_scale=width**-0.5, backend=backend
    )
    assert got.shape == (tokens, heads, v_width) and got.dtype == dtype
    want = _expected(q, k, v, lens, width**-0.5)
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype])


def test_mismatched_shapes_are_named():
    q = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match=r"v \[T, H, Dv <= D\]"):
        varlen_causal_attention(
            q, q, torch.zeros(4, 2, 16), cu_seqlens=torch.tensor([0, 4]), max_seq_len=4, softmax_scale=1.0
        )
