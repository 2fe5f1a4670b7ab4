"""Rotary embeddings: the in-place Triton kernel against the torch reference, the reference against
transformers' own rotate-half formula, on strided q/k views of one qkv projection."""

import pytest
import torch

from atom_kernels.rotary import apply_rotary
from atom_kernels.rotary.ref import apply_rotary_ref

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _qkv(tokens, hq, hkv, d, dtype):
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=DEVICE).to(dtype)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    return qkv, q, k


def test_reference_equals_transformers_rotate_half():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    _, q, k = _qkv(6, 4, 2, 64, torch.float32)
    positions = torch.tensor([0, 1, 5, 100, 4095, 70000], device=DEVICE)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, device=DEVICE).float() / 64))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    # transformers' layout: [batch, heads, tokens, D] with cos/sin [batch, tokens, D]
    want_q, want_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb.cos()[None], emb.sin()[None]
    )
    got_q, got_k = apply_rotary_ref(positions, q, k, inv_freq, rotary_dim=64)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize(
    ("heads", "head_dim", "rotary_dim"), [((8, 2), 64, 64), ((4, 4), 128, 32), ((6, 1), 80, 80)]
)
def test_triton_in_place_equals_reference(dtype, neox, heads, head_dim, rotary_dim):
    qkv, q, k = _qkv(9, heads[0], heads[1], head_dim, dtype)
    v_before = qkv[:, (heads[0] + heads[1]) * head_dim :].clone()
    positions = torch.randint(0, 32768, (9,), device=DEVICE)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, rotary_dim, 2, device=DEVICE).float() / rotary_dim))
    want_q, want_k = apply_rotary_ref(
        positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=0.9, neox=neox
    )
    got_q, got_k = apply_rotary(
        positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=0.9, neox=neox, backend="triton"
    )
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()  # in place
    torch.testing.assert_close(q, want_q, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(k, want_k, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(
        qkv[:, (heads[0] + heads[1]) * head_dim :], v_before, rtol=0, atol=0
    )  # v untouched


def test_torch_backend_rotates_in_place_too():
    _, q, k = _qkv(3, 2, 1, 32, torch.float32)
    inv_freq = torch.rand(16, device=DEVICE)
    positions = torch.arange(3, device=DEVICE)
    want = apply_rotary_ref(positions, q, k, inv_freq, rotary_dim=32)
    apply_rotary(positions, q, k, inv_freq, rotary_dim=32, backend="torch")
    torch.testing.assert_close(q, want[0])
    torch.testing.assert_close(k, want[1])


def test_bad_inputs_are_named():
    _, q, k = _qkv(3, 2, 1, 32, torch.float32)
    pos = torch.arange(3, device=DEVICE)
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary(pos, q, k, torch.rand(8, device=DEVICE), rotary_dim=33)
    with pytest.raises(ValueError, match="positions must be"):
        apply_rotary(pos[:2], q, k, torch.rand(16, device=DEVICE), rotary_dim=32)
