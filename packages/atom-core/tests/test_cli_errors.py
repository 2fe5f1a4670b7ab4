"""Bad checkpoints and arguments: `atom` exits 2 with one line naming the file, field or tensor."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from atom_core.cli import main


@pytest.fixture(scope="module")
def base(tiny_llama):
    return tiny_llama(max_position_embeddings=64)[1]


def _copy(base, tmp_path):
    import shutil

    return shutil.copytree(base, tmp_path / "ckpt")


def _edit_config(path, **fields):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **fields}))


def _edit_tensors(path, change):
    tensors = load_file(path / "model.safetensors")
    change(tensors)
    save_file(tensors, path / "model.safetensors")


def _no_config(path):
    (path / "config.json").unlink()


def _bad_json(path):
    (path / "config.json").write_text("{")


def _corrupt(path):
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not safetensors")


def _outside_index(path):
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../../etc/passwd"}}))


def _nan(tensors):
    tensors["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")


def _custom_tokenizer_code(path):
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}
        )
    )
    (path / "evil.py").write_text(f"open({str(path / 'RAN')!r}, 'w').write('ran')\n")


CASES = {
    "no config.json": (_no_config, [], "not a checkpoint dir"),
    "config.json is not JSON": (_bad_json, [], "config.json is not valid JSON"),
    "zero attention heads": (
        lambda p: _edit_config(p, num_attention_heads=0),
        [],
        "num_attention_heads must be a positive integer",
    ),
    "unknown architecture": (
        lambda p: _edit_config(p, architectures=["FooForCausalLM"]),
        [],
        "architecture 'FooForCausalLM' is not supported",
    ),
    "another activation": (
        lambda p: _edit_config(p, hidden_act="gelu"),
        [],
        "hidden_act 'gelu' is not supported",
    ),
    "a missing tensor": (
        lambda p: _edit_tensors(p, lambda t: t.pop("model.norm.weight")),
        [],
        "missing tensors for: model.norm.weight",
    ),
    "a tensor of the wrong shape": (
        lambda p: _edit_tensors(p, lambda t: t.update({"model.norm.weight": torch.ones(7)})),
        [],
        "model.norm.weight",
    ),
    "a corrupt safetensors file": (_corrupt, [], "model.safetensors is not a readable safetensors file"),
    "an index pointing outside": (_outside_index, [], "points outside the checkpoint dir: ../../etc/passwd"),
    "NaN weights": (
        lambda p: _edit_tensors(p, _nan),
        [],
        "model.layers.0.mlp.down_proj.weight holds NaN or Inf",
    ),
    "checkpoint code in the tokenizer": (_custom_tokenizer_code, [], "its tokenizer could not be loaded"),
    "max-model-len above the model's": (
        None,
        ["--max-model-len", "65"],
        "above the model's max_position_embeddings 64",
    ),
    "max-model-len over the KV cache": (
        None,
        ["--max-model-len", "64", "--num-kv-blocks", "2"],
        "does not fit the KV cache",
    ),
    "an empty API key": (None, ["--api-key", " "], "the API key from --api-key is empty"),
    "a missing API key file": (
        None,
        ["--api-key-file", "/nonexistent/key"],
        "--api-key-file /nonexistent/key",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_checkpoint_or_argument_is_one_line_and_exit_2(base, tmp_path, capsys, case):
    damage, extra, words = CASES[case]
    path = _copy(base, tmp_path)
    if damage is not None:
        damage(path)
    rc = main(["serve", "--model", str(path), "--device", "cpu", "--port", "1", *extra])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[atom] error:")]
    assert rc == 2, err
    assert len(lines) == 1 and words in lines[0], err
    assert "Traceback" not in err
    assert not (path / "RAN").exists()  # no checkpoint code ran
