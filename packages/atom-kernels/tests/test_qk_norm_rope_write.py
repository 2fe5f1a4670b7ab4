"""The fused q/k norm + rotary + KV write against the unfused references (rms_norm_ref, apply_rotary_ref /
apply_mrope_ref, write_kv_ref): Qwen3.5's shape (head 256, rotary 64, interleaved MRoPE, zero-centred
norms, q a strided view of the gated projection), plain full rotary at head 128, padding slots."""

import pytest
import torch

from atom_kernels.rotary import qk_norm_rope_write

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])


def _case(dim, rotary_dim, mrope, dtype, tokens=5, hq=4, hkv=2, blocks=6, block_size=4):
    torch.manual_seed(0)
    # q inside a [q_h | gate_h] per-head projection, k and v beside it: all strided views
    packed = torch.randn(tokens, hq * 2 * dim + 2 * hkv * dim, device=DEVICE).to(dtype)
    q = packed[:, : hq * 2 * dim].view(tokens, hq, 2 * dim)[..., :dim]
    k = packed[:, hq * 2 * dim : hq * 2 * dim + hkv * dim].view(tokens, hkv, dim)
    v = packed[:, hq * 2 * dim + hkv * dim :].view(tokens, hkv, dim)
    weights = [(torch.rand(dim, device=DEVICE) - 0.5).to(dtype) for _ in range(2)]
    t = torch.arange(tokens, device=DEVICE) + 7
    positions = torch.stack([t, t // 2, t % 3]) if mrope else t
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, device=DEVICE).float() / rotary_dim))
    caches = [torch.zeros(blocks, block_size, hkv, dim, device=DEVICE, dtype=dtype) for _ in range(2)]
    slots = torch.tensor([3, -1, 9, 0, 22][:tokens], device=DEVICE)
    return q, k, v, weights, positions, inv_freq, caches, slots


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("dim", "rotary_dim", "mrope", "offset"),
    [(256, 64, True, 1.0), (128, 128, False, 0.0), (64, 32, False, 1.0), (128, 128, False, None)],
)
def test_fused_equals_the_unfused_references(dim, rotary_dim, mrope, offset, dtype):
    """offset None: no q/k norms (Llama's rotary + KV write)."""
    q, k, v, (qw, kw), positions, inv_freq, (kc, vc), slots = _case(dim, rotary_dim, mrope, dtype)
    if offset is None:
        qw = kw = None
        offset = 0.0
    common = dict(eps=1e-6, rotary_dim=rotary_dim, weight_offset=offset, scaling=1.0)
    if mrope:
        common.update(mrope_section=(11, 11, 10) if rotary_dim == 64 else None, mrope_interleaved=True)
    want_k, want_v = kc.clone(), vc.clone()
    want = qk_norm_rope_write(
        q, k, v, qw, kw, positions, inv_freq, want_k, want_v, slots, backend="torch", **common
    )
    got = qk_norm_rope_write(q, k, v, qw, kw, positions, inv_freq, kc, vc, slots, backend="triton", **common)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(kc, want_k, rtol=tol, atol=tol)
    torch.testing.assert_close(vc, want_v, rtol=0, atol=0)
    assert (
        kc.abs().sum() > 0 and kc.view(-1, *kc.shape[2:])[1].abs().sum() == 0
    )  # slot 1 (token -1) untouched


def test_the_reference_composes_the_unfused_ops():
    """The torch path is rms_norm_ref -> apply_mrope_ref -> write_kv_ref, checked from first principles
    for one row: zero-centred norm, then the rotate-half pairs by the frequency's own position row."""
    q, k, v, (qw, kw), positions, inv_freq, (kc, vc), slots = _case(256, 64, True, torch.float32)
    out = qk_norm_rope_write(
        q,
        k,
        v,
        qw,
        kw,
        positions,
        inv_freq,
        kc,
        vc,
        slots,
        eps=1e-6,
        rotary_dim=64,
        weight_offset=1.0,
        mrope_section=(11, 11, 10),
        mrope_interleaved=True,
        backend="torch",
    )
    x = q[2, 1].float()
    y = x * torch.rsqrt(x.pow(2).mean() + 1e-6) * (1 + qw.float())
    axis = torch.tensor(
        [1 if i % 3 == 1 and i < 33 else 2 if i % 3 == 2 and i < 30 else 0 for i in range(32)]
    )
    angle = positions[axis, 2].float() * inv_freq
    x1, x2 = y[:32], y[32:64]
    want = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin(), y[64:]])
    torch.testing.assert_close(out[2, 1], want, rtol=1e-5, atol=1e-5)


def test_without_norms_only_rotates():
    """No weights: q comes back rotated, not normalized (the plain rotary reference), k likewise cached."""
    from atom_kernels.rotary.ref import apply_rotary_ref

    q, k, v, _, positions, inv_freq, (kc, vc), slots = _case(128, 128, False, torch.float32)
    out = qk_norm_rope_write(
        q, k, v, None, None, positions, inv_freq, kc, vc, slots, eps=1e-6, rotary_dim=128, backend="triton"
    )
    want_q, want_k = apply_rotary_ref(positions, q, k, inv_freq, rotary_dim=128)
    torch.testing.assert_close(out, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc.view(-1, 2, 128)[slots[0]], want_k[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="given together"):
        qk_norm_rope_write(
            q, k, v, None, inv_freq, positions, inv_freq, kc, vc, slots, eps=1e-6, rotary_dim=128
        )


@pytest.mark.gpu(reason="bf16 rounding is the GPU's (the interpreter's bf16 math is wrong)")
def test_without_norms_rounds_as_the_rotary_kernel_in_bf16():
    """Llama's path on the GPU: bit-equal to apply_rotary's kernel (no FMA contraction) and the cache write."""
    from atom_kernels.rotary import apply_rotary

    q, k, v, _, positions, inv_freq, (kc, vc), slots = _case(128, 128, False, torch.bfloat16, tokens=5)
    out = qk_norm_rope_write(
        q, k, v, None, None, positions, inv_freq, kc, vc, slots, eps=1e-6, rotary_dim=128, backend="triton"
    )
    want_q, want_k = q.contiguous(), k.contiguous()
    apply_rotary(positions, want_q, want_k, inv_freq, rotary_dim=128, backend="triton")
    assert torch.equal(out, want_q)
    assert torch.equal(kc.view(-1, 2, 128)[slots[0]], want_k[0])


def test_fp8_caches_and_bad_shapes_are_refused():
    q, k, v, (qw, kw), positions, inv_freq, (kc, vc), slots = _case(128, 128, False, torch.float32)
    with pytest.raises(ValueError, match=r"positions must be \[5\]"):
        qk_norm_rope_write(
            q, k, v, qw, kw, positions[None], inv_freq, kc, vc, slots, eps=1e-6, rotary_dim=128
        )
    with pytest.raises(ValueError, match="q, k and v must share one dtype"):
        qk_norm_rope_write(
            q, k.half(), v, qw, kw, positions, inv_freq, kc, vc, slots, eps=1e-6, rotary_dim=128
        )
    with pytest.raises(ValueError, match=r"rotary_dim 100 must be even, <= 128"):
        qk_norm_rope_write(q, k, v, qw, kw, positions, inv_freq, kc, vc, slots, eps=1e-6, rotary_dim=100)
    if hasattr(torch, "float8_e4m3fn"):
        f8 = [c.to(torch.float8_e4m3fn) for c in (kc, vc)]
        with pytest.raises(ValueError, match="fp8 caches go through write_kv"):
            qk_norm_rope_write(q, k, v, qw, kw, positions, inv_freq, *f8, slots, eps=1e-6, rotary_dim=128)
