"""A config.json that leaves fields out reads as transformers reads it, family by family: the sizes, norm
epsilon, rotary base and context transformers' config classes fill in, where ModelConfig's generic defaults
(kv heads = heads, eps 1e-6, base 1e4, context 2048) would differ."""

import dataclasses

import pytest
from transformers import Gemma3Config, Gemma3TextConfig, Glm4MoeConfig, MixtralConfig

from atom_core.config import ModelConfig

# ModelConfig's numbers and flags, as transformers' config classes name them (Mixtral's holds no
# attention_bias: its attention has none)
FIELDS = [
    f.name
    for f in dataclasses.fields(ModelConfig)
    if f.type in ("int", "float", "bool") and f.name != "attention_bias"
]


def _assert_reads_as(atom: ModelConfig, hf) -> None:
    """The sizes as transformers' config holds them (head_dim: hidden / heads where it holds none)."""
    for name in FIELDS:
        want = getattr(hf, name, None)
        if name == "head_dim" and want is None:
            want = hf.hidden_size // hf.num_attention_heads
        assert getattr(atom, name) == want, name


def _thetas(atom: ModelConfig, hf) -> tuple:
    """Rotary bases, ATOM's and transformers': Gemma 3's per layer type, the others' one."""
    if "full_attention" in hf.rope_parameters:
        kinds = ("full_attention", "sliding_attention")
        return tuple(atom.hf["rope_parameters"][k]["rope_theta"] for k in kinds), tuple(
            hf.rope_parameters[k]["rope_theta"] for k in kinds
        )
    return atom.rope.theta, hf.rope_parameters["rope_theta"]


@pytest.mark.parametrize(
    ("architecture", "config_class", "given"),
    [
        ("MixtralForCausalLM", MixtralConfig, {}),
        ("MixtralForCausalLM", MixtralConfig, {"hidden_size": 1024, "num_attention_heads": 16}),
        ("Glm4MoeForCausalLM", Glm4MoeConfig, {}),
        ("Glm4MoeForCausalLM", Glm4MoeConfig, {"num_hidden_layers": 4, "rope_theta": 5e5}),
        ("Gemma3ForCausalLM", Gemma3TextConfig, {}),
    ],
    ids=["mixtral-bare", "mixtral-some", "glm-bare", "glm-some", "gemma3-bare"],
)
def test_a_silent_config_reads_as_transformers_reads_it(architecture, config_class, given):
    atom = ModelConfig.from_hf_dict({"architectures": [architecture], **given})
    hf = config_class(**given)
    _assert_reads_as(atom, hf)
    got, want = _thetas(atom, hf)
    assert got == want
    if getattr(hf, "layer_types", None) is not None:  # Gemma 3's: five local layers to one global
        assert atom.hf["layer_types"] == hf.layer_types


def test_a_published_gemma3_multimodal_config_reads_as_transformers_reads_it():
    """gemma-3-4b-it's config.json: its text_config names no vocab_size, num_attention_heads or
    num_key_value_heads (transformers' Gemma3TextConfig defaults fill them)."""
    text = {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    }
    published = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "image_token_index": 262144,
        "mm_tokens_per_image": 256,
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27},
    }
    atom = ModelConfig.from_hf_dict(published)
    hf = Gemma3Config(text_config=dict(text), vision_config=published["vision_config"]).text_config
    _assert_reads_as(atom, hf)
    got, want = _thetas(atom, hf)
    assert got == want
    assert (atom.vocab_size, atom.num_attention_heads, atom.num_key_value_heads) == (262208, 8, 4)
    assert atom.hf["rope_parameters"]["full_attention"]["factor"] == 8.0
