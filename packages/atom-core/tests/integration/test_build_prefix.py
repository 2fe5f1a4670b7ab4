"""build_model's prefix: an adapter nests the model under its own attribute, and each attention layer's
AttentionLayerSpec.prefix must be that layer's real module path (engines use it as the layer's name); every
linear knows its own module path too (its weight format is chosen by it)."""

import pytest
import torch
from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.layers.linear import LinearBase
from atom_core.loader import build_model

HF = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


class RecordingBackend:
    """An attention backend whose layers are modules, as an engine adapter's are."""

    name = "recording"
    layer_kinds = frozenset({"mha", "sliding"})

    def __init__(self):
        self.specs = []

    def make_layer(self, spec):
        self.specs.append(spec)
        return nn.Identity()


@pytest.mark.parametrize(
    "arch", ["LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"]
)
@pytest.mark.parametrize("prefix", ["", "atom."])
def test_attention_prefixes_are_module_paths(arch, prefix):
    extra = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16} if "Moe" in arch else {}
    config = ModelConfig.from_hf_dict({"architectures": [arch], **HF, **extra}, dtype=torch.float32)
    backend = RecordingBackend()
    wrapper = nn.Module()
    model = build_model(config, BuildContext(backend), prefix=prefix)
    if prefix:
        setattr(wrapper, prefix.rstrip("."), model)
    else:
        wrapper = model
    paths = {name for name, _ in wrapper.named_modules()}
    assert [s.layer_index for s in backend.specs] == [0, 1, 2]
    for spec in backend.specs:
        assert spec.prefix in paths, spec.prefix
        assert spec.prefix == f"{prefix}model.layers.{spec.layer_index}.self_attn.attn"
    linears = {name: m for name, m in wrapper.named_modules() if isinstance(m, LinearBase)}
    assert len(linears) >= 3 * 3  # qkv, o, and the MLP's or the router's per layer
    for name, linear in linears.items():
        assert linear.prefix == name
        assert linear.quant_method.name == "unquantized"


def test_a_backend_without_a_layer_kind_is_refused_naming_the_architecture():
    class FullOnly(RecordingBackend):
        layer_kinds = frozenset({"mha"})

    hf = {
        "architectures": ["Qwen3ForCausalLM"],
        **HF,
        "layer_types": ["full_attention", "sliding_attention"] * 1,
    }
    hf["num_hidden_layers"] = 2
    hf.update(use_sliding_window=True, sliding_window=8)
    config = ModelConfig.from_hf_dict(hf, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"Qwen3ForCausalLM has sliding layers.*'recording'"):
        build_model(config, BuildContext(FullOnly()))


def test_a_quantized_checkpoint_is_refused_by_its_method():
    hf = {
        "architectures": ["LlamaForCausalLM"],
        **HF,
        "quantization_config": {"quant_method": "awq", "bits": 4},
    }
    config = ModelConfig.from_hf_dict(hf, dtype=torch.float32)
    with pytest.raises(ValueError, match="quant_method 'awq' is not supported"):
        build_model(config, BuildContext(RecordingBackend()))
