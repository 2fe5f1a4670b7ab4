"""The checkpoint's generation_config.json as the default of every sampling field a request leaves unset
(vLLM's --generation-config auto), through the Python API, the OpenAI protocol and `atom generate`;
"vllm" ignores the file; a bad value names the file and the field when the engine starts."""

import json
import shutil
from types import SimpleNamespace

import pytest

from atom_core.cli import main
from atom_core.config import ConfigError
from atom_core.engine import LLM, SamplingParams
from atom_core.engine.generation_defaults import generation_defaults
from atom_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

FILE = {
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 0,
    "max_new_tokens": 7,
    "do_sample": True,
    "eos_token_id": 2,
}
DEFAULTS = {"temperature": 0.6, "top_p": 0.95, "top_k": -1, "max_tokens": 7}


def _model(generation: dict, path="/ckpt"):
    return SimpleNamespace(generation=generation, path=path)


def test_the_sampling_fields_are_read_and_the_rest_left(tmp_path):
    assert generation_defaults(_model(FILE), "auto") == DEFAULTS  # top_k 0 is transformers' "off"
    assert generation_defaults(_model(FILE), "vllm") == {}
    assert generation_defaults(_model({}), "auto") == {}
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3}))
    assert generation_defaults(_model(FILE), str(tmp_path)) == {"temperature": 0.3}


def test_a_bad_value_or_source_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"/ckpt/generation_config.json: top_p must be in \(0, 1\]"):
        generation_defaults(_model({"top_p": 1.5}), "auto")
    with pytest.raises(ConfigError, match=r"no generation_config\.json there"):
        generation_defaults(_model({}), str(tmp_path))


def test_a_request_s_unset_fields_take_the_defaults_and_its_set_ones_stay():
    params = CompletionRequest.model_validate({"prompt": "hi"}).checked_params(DEFAULTS)
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.6, 0.95, -1, 7)
    given = {"prompt": "hi", "temperature": 0.0, "max_tokens": 3, "top_p": 1.0}
    params = CompletionRequest.model_validate(given).checked_params(DEFAULTS)
    assert (params.temperature, params.top_p, params.max_tokens) == (0.0, 1.0, 3)
    assert CompletionRequest.model_validate({"prompt": "hi"}).checked_params({}).max_tokens == 16
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert chat.checked_params(room=100, defaults=DEFAULTS).max_tokens == 7  # the room, capped
    assert chat.checked_params(room=5, defaults=DEFAULTS).max_tokens == 5
    assert chat.checked_params(room=100).max_tokens == 100


@pytest.fixture(scope="module")
def with_defaults(tiny_llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "ckpt"
    shutil.copytree(tiny_llama()[1], path)
    (path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3, "temperature": 0.0}))
    return path


def test_llm_generates_with_the_checkpoint_s_defaults_unless_told_otherwise(with_defaults):
    llm = LLM(with_defaults, device="cpu", kernel_backend="torch", num_kv_blocks=32)
    try:
        assert llm.get_default_sampling_params() == SamplingParams(max_tokens=3, temperature=0.0)
        (out,) = llm.generate({"prompt_token_ids": [1, 5, 9]})
        assert 1 <= len(out.outputs[0].token_ids) <= 3
    finally:
        llm.shutdown()
    plain = LLM(
        with_defaults, device="cpu", kernel_backend="torch", num_kv_blocks=32, generation_config="vllm"
    )
    try:
        assert plain.get_default_sampling_params() == SamplingParams()
    finally:
        plain.shutdown()


def test_atom_generate_takes_the_defaults_and_its_flags_over_them(with_defaults, capsys):
    args = ["generate", "--model", str(with_defaults), "--device", "cpu", "--kernel-backend", "torch"]
    args += ["--num-kv-blocks", "32", "--json", "--ignore-eos", "--prompt-token-ids", "1,5,9"]
    assert main(args) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 3  # the checkpoint's max_new_tokens
    assert main([*args, "--max-tokens", "5"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 5
    assert main([*args, "--generation-config", "vllm"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 32  # atom generate's own fallback
