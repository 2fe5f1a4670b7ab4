"""GPT-OSS against transformers: attention sinks, q/k/v/o biases, alternating sliding and full attention with
windows shorter than the prompts, YaRN rope without truncation, and the MoE's router and expert biases with
the clamped SwiGLU (a low limit, so that the clamps bite). Then the engine (chunked prefill, prefix-cache
hits, preemption across the window), the config defaults transformers fills in, and refusals by name."""

import json

import pytest
import torch
from core_fixtures.architectures import GPT_OSS_TINY
from core_fixtures.checkpoints import gpt_oss_extras
from core_fixtures.family import (
    assert_engine_under_pressure,
    assert_matches_transformers,
    assert_triton_matches_transformers,
    prompts,
)
from transformers import GptOssConfig

from atom_core import LLM
from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.loader import build_model
from tools.testing_models import random_checkpoint


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt-oss") / "ckpt"
    return random_checkpoint(GptOssConfig(**GPT_OSS_TINY), path, edit=gpt_oss_extras)


def test_logits_and_greedy_tokens_match_transformers(gpt_oss):
    hf, path = gpt_oss
    windows = [layer.self_attn.sliding_window for layer in hf.model.layers]
    assert windows == [5, None, 5, None]
    assert_matches_transformers(hf, path, prompts(1, (13, 3, 21)))  # two prompts past the window


def test_triton_kernels_through_the_native_backend(gpt_oss):
    """The same parity with atom-kernels' Triton path: sinks in the attention kernels, biases and the
    clamped SwiGLU in the expert GEMMs."""
    assert_triton_matches_transformers(*gpt_oss, prompts(6, (11, 4)))


def test_sinks_the_clamp_and_alpha_change_the_answer(gpt_oss):
    """Guards the parity above: without its sinks, with a clamp that never bites, or with the published
    SwiGLU alpha instead of the config's, the same model gives other logits (so a model that ignored any
    of them could not pass)."""
    hf, _ = gpt_oss
    prompt = torch.tensor([prompts(2, (9,))[0]])
    with torch.no_grad():
        base = hf(prompt).logits
        layers = hf.model.layers
        saved = [layer.self_attn.sinks.clone() for layer in layers]
        for layer in layers:
            layer.self_attn.sinks.fill_(-1e4)
        no_sinks = hf(prompt).logits
        for layer, sinks in zip(layers, saved, strict=True):
            layer.self_attn.sinks.copy_(sinks)
            layer.mlp.experts.limit = 1e4
        no_clamp = hf(prompt).logits
        for layer in layers:
            layer.mlp.experts.limit = GPT_OSS_TINY["swiglu_limit"]
            layer.mlp.experts.alpha = 1.702
        published_alpha = hf(prompt).logits
        for layer in layers:
            layer.mlp.experts.alpha = GPT_OSS_TINY["swiglu_alpha"]
    assert (base - no_sinks).abs().max() > 1e-2
    assert (base - no_clamp).abs().max() > 1e-2
    assert (base - published_alpha).abs().max() > 1e-2


def test_engine_chunks_prefix_hits_and_preemption_across_the_window(gpt_oss):
    assert_engine_under_pressure(*gpt_oss)


def _atom_model(config: ModelConfig):
    return build_model(config, BuildContext(PagedAttentionBackend(kernel_backend="torch")))


def test_a_published_config_gets_transformers_defaults(tmp_path):
    """gpt-oss's config.json leaves out what transformers fills in: the rope parameters (YaRN, theta
    150000), layer_types (sliding first, then alternating) and attention_bias (True)."""
    config = {"architectures": ["GptOssForCausalLM"], **GPT_OSS_TINY}
    for key in ("rope_parameters", "layer_types", "attention_bias"):
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = GptOssConfig(**{k: v for k, v in config.items() if k != "architectures"})
    atom = ModelConfig.from_pretrained(tmp_path)
    assert atom.rope.rope_type == "yarn" and atom.rope.theta == hf.rope_parameters["rope_theta"] == 150000
    assert atom.rope.factor == 32 and atom.rope.truncate is False and atom.attention_bias is True
    layers = _atom_model(atom).model.layers
    assert [layer.self_attn.attn.spec.sliding_window for layer in layers] == [5, None, 5, None]
    assert all(layer.self_attn.qkv_proj.bias is not None for layer in layers)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(layer_types=["chunked_attention"] * 4), r"layer_types \['chunked_attention'\]"),
        (dict(sliding_window=None), "window is None"),
        (dict(swiglu_limit=-1.0), "swiglu_oai needs a positive limit"),
    ],
)
def test_fields_atom_cannot_compute_are_refused_by_name(fields, message):
    config = ModelConfig.from_hf_dict({"architectures": ["GptOssForCausalLM"], **GPT_OSS_TINY, **fields})
    with pytest.raises(ConfigError, match=message):
        _atom_model(config)


def test_a_wrong_expert_tensor_is_named(gpt_oss, tmp_path):
    """A checkpoint whose experts' gate_up has the wrong shape names the tensor."""
    from safetensors.torch import load_file, save_file

    from atom_core.models.weights import WeightLoadError

    _, path = gpt_oss
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((path / "config.json").read_text())
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.1.mlp.experts.gate_up_proj"
    tensors[name] = tensors[name][:, :, :-2].contiguous()
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(WeightLoadError, match=name.replace(".", r"\.")):
        LLM(bad, kernel_backend="torch")
