import json

import torch
from transformers import Qwen3Config

from atom_core.config import ModelConfig
from atom_core.registry import get_model_spec, supported_architectures
from tools.testing_models import random_checkpoint


def test_every_registered_class_imports_and_declares_its_packed_modules():
    for arch in supported_architectures():
        spec = get_model_spec(arch)
        assert spec.load_class().__name__ == arch
        mla = arch.startswith("Deepseek")
        qkv = {} if mla else {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
        assert spec.packed_modules_mapping() == {**qkv, "gate_up_proj": ["gate_proj", "up_proj"]}
        # two layers: Qwen3-Next's default pattern (full attention every 4th) makes both linear attention
        expected = {"mla"} if mla else {"gdn"} if arch.startswith(("Qwen3Next", "Qwen3_5")) else {"mha"}
        if arch == "GptOssForCausalLM":  # sliding first, then full (transformers' default layer_types)
            expected = {"sliding", "mha"}
        if arch.startswith("Gemma3"):  # every 6th layer full (transformers' default): both of two slide
            expected = {"sliding"}
        assert set(spec.attention_kinds(_tiny_config(arch))) == expected


def _tiny_config(arch):
    return ModelConfig.from_hf_dict(
        dict(
            architectures=[arch],
            vocab_size=10,
            hidden_size=8,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )


def test_generation_config_is_read(tmp_path):
    config = Qwen3Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    model, _ = random_checkpoint(config, tmp_path)
    model.generation_config.temperature = 0.7
    model.generation_config.do_sample = True
    model.generation_config.save_pretrained(tmp_path)
    loaded = ModelConfig.from_pretrained(tmp_path)
    assert loaded.generation["temperature"] == 0.7
    assert loaded.generation == json.loads((tmp_path / "generation_config.json").read_text())
    assert loaded.dtype == torch.float32 and loaded.architecture == "Qwen3ForCausalLM"
