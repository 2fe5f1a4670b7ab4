"""build_model's prefix: an adapter nests the model under its own attribute, and each attention layer's
AttentionLayerSpec.prefix must be that layer's real module path (engines use it as the layer's name)."""

import pytest
import torch
from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ModelConfig
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
