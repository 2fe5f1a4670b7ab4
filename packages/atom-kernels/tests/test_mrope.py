"""MRoPE: the Triton kernel against the torch reference, and the reference against transformers' own
Qwen2-VL (chunked sections) and Qwen3.5 (interleaved sections, partial rotary) rotary embeddings."""

import importlib

import pytest
import torch

from atom_kernels.rotary import apply_mrope, apply_rotary
from atom_kernels.rotary.ref import apply_mrope_ref, mrope_axes

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _qkv(tokens, hq, hkv, d, dtype):
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=DEVICE).to(dtype)
    return qkv[:, : hq * d].view(tokens, hq, d), qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)


def _positions(tokens):
    """A text prefix (all rows equal), then an image grid whose H and W rows differ from T."""
    text = torch.arange(tokens // 2)
    grid = torch.arange(tokens - tokens // 2)
    t_row = torch.cat([text, torch.full_like(grid, int(text[-1]) + 1 if len(text) else 0)])
    h_row = torch.cat([text, t_row[len(text) :] + grid // 4])
    w_row = torch.cat([text, t_row[len(text) :] + grid % 4])
    return torch.stack([t_row, h_row, w_row]).to(DEVICE)


HF_CASES = [  # module, rotary class, config class, config kwargs, section, interleaved, rotary_dim
    (
        "qwen2_vl",
        "Qwen2VLRotaryEmbedding",
        "Qwen2VLTextConfig",
        dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1),
        (16, 24, 24),
        False,
        128,
    ),
    (
        "qwen3_5",
        "Qwen3_5TextRotaryEmbedding",
        "Qwen3_5TextConfig",
        dict(
            hidden_size=256,
            head_dim=256,
            num_attention_heads=2,
            num_key_value_heads=1,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=1e7,
                partial_rotary_factor=0.25,
                mrope_section=[11, 11, 10],
                mrope_interleaved=True,
            ),
        ),
        (11, 11, 10),
        True,
        64,
    ),
]


@pytest.mark.parametrize(
    ("module", "rotary_cls", "config_cls", "kwargs", "section", "interleaved", "rot"), HF_CASES
)
def test_matches_transformers(module, rotary_cls, config_cls, kwargs, section, interleaved, rot):
    import transformers

    hf = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    config = getattr(transformers, config_cls)(**kwargs)
    rotary = getattr(hf, rotary_cls)(config).to(DEVICE)
    head_dim = kwargs.get("head_dim", 128)
    tokens = 37
    q, k = _qkv(tokens, 4, 2, head_dim, torch.float32)
    positions = _positions(tokens)
    cos, sin = rotary(q, positions[:, None, :])  # position ids [3, batch 1, T]
    want_q, want_k = hf.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    got_q, got_k = apply_mrope(
        positions,
        q.clone(),
        k.clone(),
        rotary.inv_freq,
        rotary_dim=rot,
        section=section,
        interleaved=interleaved,
        backend="triton",
    )
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), rtol=2e-5, atol=2e-5)
    ref_q, _ = apply_mrope_ref(
        positions, q, k, rotary.inv_freq, rotary_dim=rot, section=section, interleaved=interleaved
    )
    torch.testing.assert_close(ref_q, want_q[0].transpose(0, 1), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("hq", "hkv", "d", "rot", "section", "interleaved", "neox"),
    [
        (4, 2, 128, 128, (16, 24, 24), False, True),
        (16, 2, 256, 64, (11, 11, 10), True, True),
        (3, 1, 64, 64, (8, 12, 12), False, False),
        (5, 5, 32, 24, (4, 4, 4), True, True),  # half 12: not a power of two
    ],
)
def test_kernel_matches_reference_in_place_on_strided_views(
    hq, hkv, d, rot, section, interleaved, neox, dtype
):
    tokens = 19
    q, k = _qkv(tokens, hq, hkv, d, dtype)
    positions = _positions(tokens)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, rot, 2, device=DEVICE).float() / rot))
    kwargs = dict(rotary_dim=rot, section=section, interleaved=interleaved, neox=neox, scaling=0.9)
    want_q, want_k = apply_mrope_ref(positions, q, k, inv_freq, **kwargs)
    got_q, got_k = apply_mrope(positions, q, k, inv_freq, **kwargs, backend="triton")
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
    torch.testing.assert_close(got_q, want_q, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(got_k, want_k, rtol=TOL[dtype], atol=TOL[dtype])


def test_equal_rows_are_plain_rope_and_1d_positions_dispatch_to_it():
    q, k = _qkv(9, 2, 1, 64, torch.float32)
    pos = torch.arange(9, device=DEVICE) * 7
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, 64, 2, device=DEVICE).float() / 64))
    rope_q, rope_k = apply_rotary(pos, q.clone(), k.clone(), inv_freq, rotary_dim=64, backend="triton")
    for positions in (pos.expand(3, -1).contiguous(), pos):
        got_q, got_k = apply_mrope(
            positions,
            q.clone(),
            k.clone(),
            inv_freq,
            rotary_dim=64,
            section=(8, 12, 12),
            interleaved=True,
            backend="triton",
        )
        torch.testing.assert_close(got_q, rope_q)
        torch.testing.assert_close(got_k, rope_k)


def test_axes_follow_each_layout():
    assert mrope_axes(6, (2, 2, 2), interleaved=False).tolist() == [0, 0, 1, 1, 2, 2]
    assert mrope_axes(6, (2, 2, 2), interleaved=True).tolist() == [0, 1, 2, 0, 1, 2]
    # Qwen3.5: 11 + 11 + 10; W's section ends at 30, so frequency 32 (32 % 3 == 2) falls back to T.
    axes = mrope_axes(32, (11, 11, 10), interleaved=True).tolist()
    assert (
        axes[29] == 2 and axes[31] == 1 and axes[32 - 1] == 1 and axes.count(2) == 10 and axes.count(1) == 11
    )


def test_empty_batch():
    q, k = _qkv(0, 2, 1, 32, torch.float32)
    apply_mrope(
        torch.zeros(3, 0, dtype=torch.long, device=DEVICE),
        q,
        k,
        torch.ones(16, device=DEVICE),
        rotary_dim=32,
        section=(4, 6, 6),
        interleaved=False,
        backend="triton",
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(section=(4, 4, 4)), r"must be 3 sizes summing to rotary_dim / 2 = 16"),
        (dict(section=(8, 8)), r"must be 3 sizes"),
        (dict(positions=torch.zeros(2, 5, dtype=torch.long)), r"positions must be \[3, T=5\]"),
        (dict(rotary_dim=30, section=(4, 6, 5)), r"rotary_dim 30 must be even, <= 32, with inv_freq"),
    ],
)
def test_bad_input_is_named(change, message):
    q, k = _qkv(5, 2, 1, 32, torch.float32)
    args = dict(positions=torch.zeros(3, 5, dtype=torch.long), rotary_dim=32, section=(4, 6, 6))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        apply_mrope(
            args["positions"].to(DEVICE),
            q,
            k,
            torch.ones(16, device=DEVICE),
            rotary_dim=args["rotary_dim"],
            section=args["section"],
            interleaved=False,
        )


def test_multi_token_tiles_match_one_token_tiles():
    # BLOCK_T > 1 is a sweep option (benchmarks/sweep_rotary.py): it must rotate exactly what BLOCK_T=1 does,
    # including the masked tail of the last tile.
    from atom_kernels.rotary.packs import head_rows
    from atom_kernels.rotary.rope import _rotary_kernel

    tokens, hq, hkv, d, rot, section = 11, 4, 2, 64, 32, (4, 6, 6)
    q, k = _qkv(tokens, hq, hkv, d, torch.float32)
    positions = _positions(tokens)
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, rot, 2, device=DEVICE).float() / rot))
    want_q, want_k = apply_mrope_ref(
        positions, q, k, inv_freq, rotary_dim=rot, section=section, interleaved=True
    )
    _rotary_kernel[(3,)](
        positions,
        head_rows(q),
        head_rows(k),
        inv_freq,
        tokens,
        positions.stride(0),
        1.0,
        SECTION=(4, 6, 6),
        INTERLEAVED=True,
        MROPE=True,
        NEOX=True,
        HALF=16,
        BLOCK_QH=4,
        BLOCK_KH=2,
        BLOCK_HALF=16,
        BLOCK_T=4,
    )
    torch.testing.assert_close(q, want_q, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(k, want_k, rtol=2e-5, atol=2e-5)
