"""ATOM's Gated DeltaNet layer against transformers' (Qwen3-Next's grouped projections and Qwen3.5's split
ones), fp32 on the CPU: a ragged batch prefilled in two chunks and then decoded token by token through the
engine's state slots gives transformers' outputs for every token, computed one sequence at a time."""

import pytest
import torch

from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.cache import allocate_caches
from atom_core.cache.metadata import StateMetadata
from atom_core.config import CacheConfig, ConfigError, ModelConfig, ParallelConfig
from atom_core.forward_context import ForwardContext, bind_forward_context
from atom_core.layers.gdn import GatedDeltaNet

# value heads twice the key heads, key dim != value dim: both groupings and both head widths are exercised
LINEAR = dict(
    hidden_size=48,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=64,
    intermediate_size=32,
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # Triton natively there, else the interpreter
ARCHS = {
    "qwen3-next": ("Qwen3NextForCausalLM", True),
    "qwen3.5": ("Qwen3_5ForCausalLM", False),
}


# (key, value) head sizes: powers of two, and sizes that are not (the kernels pad and mask them)
HEADS = {"16-32": (16, 32), "24-40": (24, 40)}


def _linear(heads: str) -> dict:
    dk, dv = HEADS[heads]
    return {**LINEAR, "linear_key_head_dim": dk, "linear_value_head_dim": dv}


def _hf_layer(arch: str, heads: str):
    linear = _linear(heads)
    if arch == "qwen3-next":
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet as Layer

        config = Qwen3NextConfig(**linear, layer_types=["linear_attention"])
    else:
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet as Layer

        config = Qwen3_5TextConfig(**linear, layer_types=["linear_attention"])
    torch.manual_seed(0)
    layer = Layer(config, 0).eval()
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if name == "A_log":
                param.copy_(torch.rand_like(param) * 2 - 1)
            elif name == "dt_bias":
                param.uniform_(-1, 1)
            elif name == "norm.weight":
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0, 0.2)
    return layer


def _atom_layer(arch: str, heads: str, hf_layer, kernel_backend: str):
    name, grouped = ARCHS[arch]
    config = ModelConfig.from_hf_dict({"architectures": [name], **_linear(heads), "torch_dtype": "float32"})
    with torch.device(DEVICE):  # where the loader would build it
        layer = GatedDeltaNet(
            config,
            BuildContext(PagedAttentionBackend(kernel_backend=kernel_backend), device=DEVICE),
            layer_index=0,
            prefix="model.layers.0.linear_attn",
            grouped_projections=grouped,
        )
    params = dict(layer.named_parameters())
    with torch.no_grad():
        for key, value in hf_layer.state_dict().items():
            params[key].copy_(value)  # to the layer's device
    assert set(params) == set(hf_layer.state_dict())  # the checkpoint's names, nothing else
    return layer


def _hf_outputs(layer, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return layer(x[None])[0]


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("kernel_backend", ["torch", "triton"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_chunked_prefill_and_decode_equal_transformers(arch, kernel_backend, heads, monkeypatch):
    from atom_kernels import settings
    from atom_kernels.settings import Backend, Settings

    # every op of the layer on the chosen backend (the engine's kernel_backend only reaches attention)
    backend = Backend.TORCH if kernel_backend == "torch" else Backend.TRITON
    monkeypatch.setattr(settings, "SETTINGS", Settings(backend, settings.SETTINGS.triton_interpret))
    if backend is Backend.TRITON and not torch.cuda.is_available() and not settings.SETTINGS.triton_interpret:
        pytest.fail("the Triton path on the CPU needs TRITON_INTERPRET=1 (set by the test environment)")
    hf = _hf_layer(arch, heads)
    ours = _atom_layer(arch, heads, hf, kernel_backend)
    lengths, first_chunk, decode_steps = [9, 3, 14], [5, 3, 8], 3
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(n + decode_steps, LINEAR["hidden_size"], generator=gen) for n in lengths]
    want = [_hf_outputs(hf, x) for x in inputs]
    caches = allocate_caches(
        [ours.cache_spec], CacheConfig(), dtype=torch.float32, num_blocks=0, num_slots=6, device=DEVICE
    )
    slots = [4, 0, 2]  # not the sequences' order: each reads and writes only its own slot
    done = [0, 0, 0]
    got: list[list[torch.Tensor]] = [[], [], []]

    def forward(counts: list[int]):
        rows = torch.cat([inputs[i][done[i] : done[i] + c] for i, c in enumerate(counts) if c]).to(DEVICE)
        live = [i for i, c in enumerate(counts) if c]
        meta = StateMetadata.build(
            slots=[slots[i] for i in live],
            fresh=[done[i] == 0 for i in live],
            query_lens=[counts[i] for i in live],
            device=DEVICE,
        )
        with bind_forward_context(ForwardContext({"state": meta}, caches)), torch.no_grad():
            out = ours(rows)
        start = 0
        for i in live:
            got[i].append(out[start : start + counts[i]].cpu())
            start += counts[i]
            done[i] += counts[i]

    forward(first_chunk)  # the first chunk of every prompt
    forward([n - c for n, c in zip(lengths, first_chunk, strict=True)])  # the rest (the second has none)
    for _ in range(decode_steps):
        forward([1, 1, 1])
    for i, expected in enumerate(want):
        torch.testing.assert_close(torch.cat(got[i]), expected, rtol=2e-4, atol=2e-4)


def test_unsupported_configs_are_refused_by_name():
    config = ModelConfig.from_hf_dict(
        {
            "architectures": ["Qwen3NextForCausalLM"],
            **LINEAR,
            "linear_num_value_heads": 3,
            "torch_dtype": "float32",
        }
    )
    ctx = BuildContext(PagedAttentionBackend(kernel_backend="torch"))
    with pytest.raises(ConfigError, match=r"linear_num_value_heads \(3\) must be a multiple"):
        GatedDeltaNet(config, ctx, layer_index=0, prefix="x", grouped_projections=True)
    wide = {"architectures": ["Qwen3NextForCausalLM"], **LINEAR, "linear_key_head_dim": 192}
    with pytest.raises(  # at load, not per request
        ConfigError, match=r"linear_key_head_dim 192, .*supported: key heads up to 128"
    ):
        GatedDeltaNet(
            ModelConfig.from_hf_dict({**wide, "torch_dtype": "float32"}),
            ctx,
            layer_index=0,
            prefix="x",
            grouped_projections=True,
        )
    wide_bf16 = ModelConfig.from_hf_dict({**wide, "torch_dtype": "bfloat16"})
    GatedDeltaNet(wide_bf16, ctx, layer_index=0, prefix="x", grouped_projections=True)  # key heads up to 256
    good = ModelConfig.from_hf_dict(
        {"architectures": ["Qwen3NextForCausalLM"], **LINEAR, "torch_dtype": "float32"}
    )
    with pytest.raises(
        ConfigError, match=r"linear_num_key_heads \(2\) must be divisible by tensor_parallel_size \(4\)"
    ):
        GatedDeltaNet(
            good,
            BuildContext(PagedAttentionBackend(kernel_backend="torch"), parallel=ParallelConfig(tp_size=4)),
            layer_index=0,
            prefix="x",
            grouped_projections=True,
        )


def test_a_conv_activation_the_kernels_lack_is_refused_by_name():
    from atom_core.attention.gdn import GDNLayerSpec

    fields = dict(
        layer_index=0,
        num_k_heads=2,
        num_v_heads=4,
        head_k_dim=16,
        head_v_dim=32,
        conv_width=4,
        state_dtype=torch.float32,
        prefix="model.layers.0.linear_attn.core",
    )
    assert GDNLayerSpec(**fields).conv_silu  # the default: every Qwen3-Next / Qwen3.5 checkpoint
    assert not GDNLayerSpec(**fields, conv_activation=None).conv_silu
    with pytest.raises(ValueError, match=r"linear_attn.core: the GDN conv's activation .* got 'gelu'"):
        GDNLayerSpec(**fields, conv_activation="gelu")


@pytest.mark.parametrize("kernel_backend", ["torch", "triton"])
def test_a_snapshot_partway_through_a_chunk_is_the_state_there(kernel_backend, monkeypatch):
    """The prefix cache's snapshot: a chunk that passes a kept boundary leaves, in the snapshot's slot,
    both states a run that ended at the boundary leaves in its own (and its outputs are unchanged)."""
    from atom_kernels import settings
    from atom_kernels.settings import Backend, Settings

    backend = Backend.TORCH if kernel_backend == "torch" else Backend.TRITON
    monkeypatch.setattr(settings, "SETTINGS", Settings(backend, settings.SETTINGS.triton_interpret))
    hf = _hf_layer("qwen3.5", "24-40")
    ours = _atom_layer("qwen3.5", "24-40", hf, kernel_backend)
    gen = torch.Generator().manual_seed(2)
    # sequence 0 keeps its state after 70 of 75 tokens (past the 64-token chunk), sequence 1 keeps none
    x = [torch.randn(n, LINEAR["hidden_size"], generator=gen).to(DEVICE) for n in (75, 6)]
    caches = allocate_caches(
        [ours.cache_spec], CacheConfig(), dtype=torch.float32, num_blocks=0, num_slots=5, device=DEVICE
    )
    states = caches[0].states

    def forward(rows, slots, lens, kept=()):
        meta = StateMetadata.build(
            slots=slots, fresh=[True] * len(slots), query_lens=lens, snapshot_slots=kept,
            snapshot_lens=[70, 0][: len(kept)], device=DEVICE,
        )  # fmt: skip
        with bind_forward_context(ForwardContext({"state": meta}, caches)), torch.no_grad():
            return ours(torch.cat(rows))

    boundary = forward([x[0][:70]], [4], [70])  # the run that ends at the boundary, in slot 4
    out = forward(x, [0, 1], [75, 6], kept=[3, -1])
    plain = forward(x, [2, 1], [75, 6])
    assert torch.equal(states["conv"][3], states["conv"][4])  # the conv window: the same inputs
    torch.testing.assert_close(states["recurrent"][3], states["recurrent"][4], rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(out[:70], boundary, rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(out, plain, rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(states["recurrent"][0], states["recurrent"][2], rtol=2e-4, atol=2e-4)
