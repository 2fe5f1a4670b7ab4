"""Bad checkpoints and configs give errors that name the problem."""

import json

import pytest
import torch
from core_support import TINY, random_checkpoint
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import CacheConfig, ConfigError, ModelConfig, ParallelConfig, resolve_dtype
from atom_core.loader import CheckpointError, build_model, load_checkpoint
from atom_core.models.weights import WeightLoadError
from atom_core.registry import UnsupportedArchitecture, supported_architectures


@pytest.fixture
def checkpoint(tmp_path):
    config = LlamaConfig(**dict(TINY, vocab_size=64, hidden_size=32, intermediate_size=48))
    return random_checkpoint(config, tmp_path / "ckpt")[1]


def _model(path):
    return build_model(
        ModelConfig.from_pretrained(path), BuildContext(PagedAttentionBackend(kernel_backend="torch"))
    )


def _rewrite(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


def test_missing_tensor_is_named(checkpoint):
    _rewrite(checkpoint, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight"))
    with pytest.raises(
        CheckpointError, match=r"missing tensors for: model\.layers\.1\.self_attn\.qkv_proj\.weight"
    ):
        load_checkpoint(_model(checkpoint), checkpoint)


def test_wrong_shape_is_named(checkpoint):
    _rewrite(checkpoint, lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight", torch.zeros(32, 47)))
    with pytest.raises(
        WeightLoadError,
        match=r"'model\.layers\.0\.mlp\.down_proj\.weight'.*expected shape \(32, 48\), got \(32, 47\)",
    ):
        load_checkpoint(_model(checkpoint), checkpoint)


def test_unexpected_tensor_is_named(checkpoint):
    _rewrite(checkpoint, lambda t: t.__setitem__("model.layers.0.mlp.extra.weight", torch.zeros(2)))
    with pytest.raises(WeightLoadError, match=r"no place for: model\.layers\.0\.mlp\.extra\.weight"):
        load_checkpoint(_model(checkpoint), checkpoint)


def test_unsupported_architecture_lists_the_supported_ones(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UnsupportedArchitecture, match=r"'GPT2LMHeadModel' is not supported.*LlamaForCausalLM"
    ):
        _model(checkpoint)
    assert set(supported_architectures()) >= {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}


def test_pickled_weights_are_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="never unpickles"):
        load_checkpoint(torch.nn.Linear(1, 1), tmp_path)


def test_dummy_weights_fill_every_parameter_deterministically(checkpoint):
    a, b = _model(checkpoint), _model(checkpoint)
    load_checkpoint(a, None, load_format="dummy")
    load_checkpoint(b, None, load_format="dummy")
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert pa.abs().sum() > 0, name
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"num_attention_heads": 5}, "must be a multiple of num_key_value_heads"),
        ({"architectures": []}, "names no architecture"),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
            "rope type 'longrope' is not supported",
        ),
        ({"hidden_size": -4}, "hidden_size must be a positive integer"),
    ],
)
def test_bad_config_is_named(checkpoint, edit, message):
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(edit)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf_dict(config)


def test_engine_configs_validate():
    with pytest.raises(ConfigError, match="KV layout"):
        CacheConfig(layout="paged")
    with pytest.raises(ConfigError, match=r"tp_rank 2 is outside \[0, 2\)"):
        ParallelConfig(tp_size=2, tp_rank=2)
    with pytest.raises(ConfigError, match="dtype 'float8'"):
        resolve_dtype("float8", {})
