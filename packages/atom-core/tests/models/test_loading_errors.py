"""Bad checkpoints and configs give errors that name the problem."""

import json

import pytest
import torch
from core_fixtures.architectures import TINY
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import CacheConfig, ConfigError, ModelConfig, ParallelConfig, resolve_dtype
from atom_core.loader import CheckpointError, build_model, load_checkpoint
from atom_core.models.weights import WeightLoadError
from atom_core.registry import UnsupportedArchitecture, supported_architectures
from tools.testing_models import random_checkpoint


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


@pytest.mark.parametrize(
    ("index", "words"),
    [
        ({"weight_map": ["model.safetensors"]}, "weight_map is a list, not a mapping"),
        ({"weight_map": {"model.norm.weight": 3}}, "weight_map maps 'model.norm.weight' to 3"),
        ({"metadata": {}}, "has no weight_map"),
        (["model.safetensors"], "is a list, not a JSON object"),
    ],
)
def test_an_index_whose_weight_map_is_not_names_to_files_is_named(checkpoint, index, words):
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors\.index\.json.*{words}"):
        load_checkpoint(_model(checkpoint), checkpoint)


def test_an_absurd_vocab_size_is_refused_naming_it(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["vocab_size"] = 2**33
    (checkpoint / "config.json").write_text(json.dumps(config))
    # 2**33 rows of 32 fp32 values: 1 TiB for the embedding, as much again for the untied head
    with pytest.raises(ConfigError, match=r"need 2\.0 TiB on cpu.*available.*vocab_size 8589934592"):
        _model(checkpoint)


def test_weights_that_cannot_fit_the_host_are_refused_with_need_and_available(checkpoint, monkeypatch):
    import atom_core.loader as loader

    monkeypatch.setattr(loader, "available_memory", lambda device: 1000)
    with pytest.raises(
        ConfigError, match=r"LlamaForCausalLM's weights need \d+\.\d KiB on cpu, but 1000 B are available"
    ):
        _model(checkpoint)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.int64])
@pytest.mark.parametrize(
    "name",
    ["model.norm.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"],
)
def test_a_non_floating_tensor_for_a_float_weight_is_named(checkpoint, name, dtype):
    _rewrite(checkpoint, lambda t: t.__setitem__(name, t[name].to(dtype)))
    with pytest.raises(WeightLoadError, match=rf"'{name}' is {dtype}, where a floating-point weight"):
        load_checkpoint(_model(checkpoint), checkpoint)


@pytest.mark.parametrize("eps", [-1, 0, float("nan"), float("inf"), "1e-6", None, True])
def test_a_bad_rms_norm_eps_is_named(checkpoint, eps):
    config = json.loads((checkpoint / "config.json").read_text())
    config["rms_norm_eps"] = eps
    with pytest.raises(ConfigError, match=r"rms_norm_eps must be a positive finite number"):
        ModelConfig.from_hf_dict(config)


def _outside_file(tmp_path, name):
    outside = tmp_path / "elsewhere"
    outside.mkdir(exist_ok=True)
    return outside / name


@pytest.mark.parametrize(
    "name", ["model.safetensors", "config.json", "generation_config.json", "model.safetensors.index.json"]
)
def test_a_file_linking_outside_the_checkpoint_is_refused(checkpoint, tmp_path, name):
    target = _outside_file(tmp_path, name)
    if name == "model.safetensors.index.json":
        target.write_text(json.dumps({"weight_map": {"model.norm.weight": "model.safetensors"}}))
    else:
        (checkpoint / name).rename(target)
    (checkpoint / name).symlink_to(target)
    with pytest.raises(ValueError, match=rf"{name} is a link to .*elsewhere.*outside the checkpoint dir"):
        load_checkpoint(_model(checkpoint), checkpoint)


def test_a_shard_linking_outside_is_refused_through_the_index(checkpoint, tmp_path):
    target = _outside_file(tmp_path, "model.safetensors")
    (checkpoint / "model.safetensors").rename(target)
    (checkpoint / "shard.safetensors").symlink_to(target)
    names = load_file(target)
    index = {"weight_map": dict.fromkeys(names, "shard.safetensors")}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"points outside the checkpoint dir: shard\.safetensors"):
        load_checkpoint(_model(checkpoint), checkpoint)


def _hub_cache_layout(checkpoint, repo):
    """The Hugging Face hub cache's layout: repo/snapshots/<revision>/<file> -> ../../blobs/<hash>."""
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, file in enumerate(sorted(checkpoint.iterdir())):
        file.rename(repo / "blobs" / f"blob{i}")
        (snapshot / file.name).symlink_to(f"../../blobs/blob{i}")
    return snapshot


def test_the_hub_cache_layout_loads(tmp_path):
    config = LlamaConfig(**dict(TINY, vocab_size=64, hidden_size=32, intermediate_size=48))
    model_dir = random_checkpoint(config, tmp_path / "ckpt", max_shard_size="20KB")[1]
    assert (model_dir / "model.safetensors.index.json").is_file()  # sharded: the index is checked too
    snapshot = _hub_cache_layout(model_dir, tmp_path / "hub" / "models--org--tiny")
    load_checkpoint(_model(snapshot), snapshot)


def test_a_hub_cache_link_leaving_the_repo_is_refused(checkpoint, tmp_path):
    snapshot = _hub_cache_layout(checkpoint, tmp_path / "hub" / "models--org--tiny")
    target = _outside_file(tmp_path, "model.safetensors")
    (snapshot / "model.safetensors").resolve().rename(target)
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(target)
    with pytest.raises(CheckpointError, match=r"model\.safetensors is a link to .*outside the checkpoint"):
        load_checkpoint(_model(snapshot), snapshot)


def test_a_tokenizer_auto_map_is_ignored_and_runs_no_code(tmp_path):
    """As vLLM without --trust-remote-code: transformers' own class loads the tokenizer; one whose class
    exists only as the checkpoint's code is refused (test_cli_errors.py)."""
    from atom_core.demo import _train_tokenizer
    from atom_core.engine.tokenizing import load_tokenizer

    _train_tokenizer(vocab_size=300).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "evil.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').write('ran')\n")
    tokenizer = load_tokenizer(tmp_path)
    assert type(tokenizer).__module__.startswith("transformers.")
    assert tokenizer("hello").input_ids
    assert not (tmp_path / "RAN").exists()
