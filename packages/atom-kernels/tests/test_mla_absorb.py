"""The absorbed MLA frontend's per-head products against torch's batched matmuls."""

import pytest
import torch

from atom_kernels.mla.absorb import absorb_output, absorb_query

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _frontend(tokens, heads, nope, rope, rank, v_dim, dtype):
    """A projected query [T, H, nope + P] (split as the layer splits it) and kv_b_proj's weight viewed
    per head [H, nope + v, R], as MLAAttention holds them."""
    q = torch.randn(tokens, heads, nope + rope, device=DEVICE).to(dtype)
    w = (torch.randn(heads, nope + v_dim, rank, device=DEVICE) / nope**0.5).to(dtype)
    return q, w


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "heads", "nope", "rope", "rank", "v_dim"),
    [(1, 2, 16, 8, 64, 16), (3, 3, 32, 4, 128, 32), (2, 2, 12, 6, 40, 20)],
)
def test_absorb_query_is_the_batched_product_beside_q_pe(
    tokens, heads, nope, rope, rank, v_dim, dtype, backend
):
    q, w = _frontend(tokens, heads, nope, rope, rank, v_dim, dtype)
    q_nope, q_pe = q.split([nope, rope], dim=-1)  # strided views, as the layer has them
    w_uk = w[:, :nope]
    got = absorb_query(q_nope, q_pe, w_uk, backend=backend)
    latent = torch.bmm(q_nope.float().transpose(0, 1), w_uk.float()).transpose(0, 1)
    assert got.shape == (tokens, heads, rank + rope) and got.is_contiguous()
    torch.testing.assert_close(got[..., :rank].float(), latent, rtol=TOL[dtype], atol=TOL[dtype])
    assert torch.equal(got[..., rank:], q_pe)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "heads", "rank", "v_dim"), [(1, 2, 64, 16), (4, 3, 256, 48), (3, 2, 40, 20), (1, 1, 200, 8)]
)
def test_absorb_output_is_the_batched_product(tokens, heads, rank, v_dim, dtype, backend):
    nope = 16
    _, w = _frontend(tokens, heads, nope, 8, rank, v_dim, dtype)
    w_uv = w[:, nope:]  # [H, v, R], a view
    o = torch.randn(tokens, heads, rank, device=DEVICE).to(dtype)
    got = absorb_output(o, w_uv, backend=backend)
    want = torch.bmm(o.float().transpose(0, 1), w_uv.float().transpose(1, 2)).transpose(0, 1)
    assert got.shape == (tokens, heads, v_dim)
    torch.testing.assert_close(got.float(), want, rtol=TOL[dtype], atol=TOL[dtype])


def test_absorb_names_shapes_that_do_not_fit():
    q, w = _frontend(1, 2, 16, 8, 64, 16, torch.float32)
    with pytest.raises(ValueError, match="w_uk"):
        absorb_query(q[..., :16], q[..., 16:], w[:, :8])
    with pytest.raises(ValueError, match="w_uv"):
        absorb_output(torch.randn(1, 2, 64, device=DEVICE), torch.randn(2, 12, 32, device=DEVICE))


def test_absorb_names_ranks_dtypes_and_token_counts_it_does_not_take():
    q, w = _frontend(1, 2, 16, 8, 64, 16, torch.float32)
    with pytest.raises(ValueError, match=r"q_pe of 3 dimensions, got shape \(1, 8\)"):
        absorb_query(q[..., :16], q[:, 0, 16:], w[:, :16])
    with pytest.raises(ValueError, match=r"got w_uk in torch\.float16 beside torch\.float32"):
        absorb_query(q[..., :16], q[..., 16:], w[:, :16].half())
    many = torch.randn(9, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"at most MAX_ABSORB_TOKENS=8 tokens .* got 9"):
        absorb_output(many, w[:, 16:])
    with pytest.raises(ValueError, match="o's last dimension contiguous"):
        absorb_output(many[:1].transpose(1, 2).contiguous().transpose(1, 2), w[:, 16:])
