"""Bad checkpoints and arguments: `atom` exits 2 with one line naming the file, field or tensor."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from atom_core.cli import main

# Any free port: the socket is bound before the model loads; never_serves makes a case that is not refused
# fail at once instead of serving forever.
NO_SERVER = ["--host", "127.0.0.1", "--port", "0"]


@pytest.fixture(autouse=True)
def never_serves(monkeypatch):
    from atom_core.entrypoints.openai.connections import Server

    def run(self, sockets=None):
        raise AssertionError("the command was not refused: it would serve")

    monkeypatch.setattr(Server, "run", run)


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


def _list_weight_map(path):
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))


def _link_outside(path):
    outside = path.parent / "elsewhere.safetensors"
    (path / "model.safetensors").rename(outside)
    (path / "model.safetensors").symlink_to(outside)


def _int8(tensors):
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name].to(torch.int8)


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
    "a weight_map that is a list": (
        _list_weight_map,
        [],
        "model.safetensors.index.json: weight_map is a list, not a mapping",
    ),
    "a weight file linking outside": (_link_outside, [], "model.safetensors is a link to"),
    "an int8 weight": (
        lambda p: _edit_tensors(p, _int8),
        [],
        "'model.layers.0.mlp.down_proj.weight' is torch.int8",
    ),
    "an absurd vocab_size": (
        lambda p: _edit_config(p, vocab_size=2**33),
        [],
        "vocab_size 8589934592",
    ),
    "a negative rms_norm_eps": (
        lambda p: _edit_config(p, rms_norm_eps=-1),
        [],
        "rms_norm_eps must be a positive finite number, got -1",
    ),
    "a non-ASCII API key": (None, ["--api-key", "clé"], "the API key from --api-key has a non-ASCII"),
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
    rc = main(["serve", "--model", str(path), "--device", "cpu", *NO_SERVER, *extra])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[atom] error:")]
    assert rc == 2, err
    assert len(lines) == 1 and words in lines[0], err
    assert "Traceback" not in err
    assert not (path / "RAN").exists()  # no checkpoint code ran


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[atom] error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_triton_on_the_cpu_without_the_interpreter_is_refused_at_startup(base, capsys, monkeypatch):
    import atom_kernels.settings as settings

    monkeypatch.setattr(settings, "SETTINGS", settings.Settings(default_backend=None, triton_interpret=False))
    rc = main(["serve", "--model", str(base), "--device", "cpu", *NO_SERVER, "--kernel-backend", "triton"])
    line = _one_error_line(capsys)
    assert rc == 2
    assert "kernel_backend 'triton' cannot run on cpu" in line and "TRITON_INTERPRET=1" in line, line
    assert line.endswith("on cpu: torch"), line


@pytest.mark.parametrize("key", ["clé", "tab\tin"])
def test_an_unsendable_api_key_from_the_environment_is_refused(base, capsys, monkeypatch, key):
    monkeypatch.setenv("ATOM_API_KEY", key)
    rc = main(["serve", "--model", str(base), "--device", "cpu", *NO_SERVER])
    assert rc == 2
    assert "the API key from ATOM_API_KEY has a non-ASCII or control character" in _one_error_line(capsys)


def test_an_unsendable_api_key_file_is_refused(base, tmp_path, capsys):
    key = tmp_path / "key"
    key.write_text("sécret\n")
    rc = main(["serve", "--model", str(base), "--device", "cpu", *NO_SERVER, "--api-key-file", str(key)])
    assert rc == 2
    line = _one_error_line(capsys)
    assert f"the API key from {key} has a non-ASCII" in line and "sécret" not in line  # the key never shown


def test_create_app_refuses_an_unsendable_key():
    from atom_core.entrypoints.openai.app import create_app

    with pytest.raises(ValueError, match="non-ASCII or control character"):
        create_app(None, "m", api_key="clé")


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_an_argparse_error(capsys, port):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--port", port])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"argument --port: {port} is not a TCP port (0..65535" in err.splitlines()[-1], err
    assert "Traceback" not in err


def test_generate_exits_1_when_the_engine_fails_a_request(base, tmp_path, capsys):
    path = _copy(base, tmp_path)  # finite weights whose logits overflow fp32: every request fails
    _edit_tensors(path, lambda t: t["model.norm.weight"].fill_(3e38))
    code = main(["generate", "--model", str(path), "--device", "cpu", "--prompt-token-ids", "1,2,3"])
    assert code == 1
    assert "failed: the model produced non-finite logits" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the GPU the case says is missing")
def test_device_cuda_without_a_gpu_is_one_line(base, capsys):
    rc = main(["generate", "--model", str(base), "--device", "cuda", "--prompt-token-ids", "1,2"])
    line = _one_error_line(capsys)
    assert rc == 2
    assert "device 'cuda': torch" in line and "sees no CUDA GPU here; use device 'cpu'" in line, line


def test_a_tensor_parallel_size_the_heads_do_not_divide_is_refused_before_any_worker(base, capsys):
    """(tiny Llama: 4 heads) one line from this process; no worker started, so none prints its traceback."""
    import multiprocessing

    rc = main(["generate", "--model", str(base), "--device", "cpu", "--tensor-parallel-size", "3"])
    line = _one_error_line(capsys)
    assert rc == 2
    assert line == "[atom] error: num_attention_heads 4 is not divisible by tensor-parallel size 3", line
    assert multiprocessing.active_children() == []


def test_an_architecture_atom_has_no_model_for_says_so_not_which_field_it_lacks(tmp_path, capsys):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "vocab_size": 100})
    )
    rc = main(["generate", "--model", str(tmp_path), "--device", "cpu"])
    line = _one_error_line(capsys)
    assert rc == 2
    assert line.startswith(
        "[atom] error: architecture 'GPT2LMHeadModel' is not supported by ATOM; supported: "
    )
    assert "LlamaForCausalLM" in line
