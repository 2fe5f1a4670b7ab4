"""Gemma 3 text against transformers: sandwich norms (zero-centred, randomized), q/k norms,
query_pre_attn_scalar, local and global layers with windows shorter than the prompts and their own rotary
bases (the global ones linearly scaled), the GELU-tanh MLP, scaled embeddings, tied head and final-logit
soft-capping. Then the engine (chunked prefill, prefix hits, preemption), the text-only multimodal
checkpoint, the older config form transformers still reads, and refusals by name."""

import json

import pytest
import torch
from core_fixtures.family import (
    assert_engine_under_pressure,
    assert_matches_transformers,
    assert_triton_matches_transformers,
    prompts,
)
from safetensors.torch import load_file, save_file
from transformers import Gemma3TextConfig

from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.loader import build_model
from tools.testing_models import TINY_ARCHITECTURES, TINY_DIMS, random_checkpoint

GEMMA3_TINY = {
    **TINY_DIMS,
    **TINY_ARCHITECTURES["Gemma3ForCausalLM"],
    "vocab_size": 211,
    "num_hidden_layers": 4,
    "sliding_window": 5,  # shorter than the prompts
    "final_logit_softcapping": 3.0,
}


def gemma_extras(model) -> None:
    """Norm weights as a trained model has them (transformers draws zeros: 1 + 0 would hide a norm that
    forgot the offset)."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=gen))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3") / "ckpt"
    return random_checkpoint(Gemma3TextConfig(**GEMMA3_TINY), path, edit=gemma_extras)


def test_logits_and_greedy_tokens_match_transformers(gemma):
    hf, path = gemma
    assert hf.config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert_matches_transformers(hf, path, prompts(1, (13, 3, 21)))  # two prompts past the window


def test_the_default_five_local_layers_to_one_global(tmp_path):
    """transformers' own layer pattern (no sliding_window_pattern, no layer_types): five windowed layers,
    then a global one, the prompts longer than the window."""
    fields = {k: v for k, v in GEMMA3_TINY.items() if k not in ("sliding_window_pattern", "layer_types")}
    hf, path = random_checkpoint(
        Gemma3TextConfig(**dict(fields, num_hidden_layers=6)), tmp_path / "ckpt", edit=gemma_extras
    )
    assert hf.config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert_matches_transformers(hf, path, prompts(3, (12, 17)))


def test_the_options_change_the_answer(gemma):
    """Guards the parity above: transformers' own model without the soft-cap, with one rotary base for
    every layer, or with the default softmax scale gives other logits."""
    hf, _ = gemma
    prompt = torch.tensor([prompts(2, (15,))[0]])
    with torch.no_grad():
        base = hf(prompt).logits
        hf.config.final_logit_softcapping = None
        uncapped = hf(prompt).logits
        hf.config.final_logit_softcapping = GEMMA3_TINY["final_logit_softcapping"]
        rotary = hf.model.rotary_emb
        local = rotary.sliding_attention_inv_freq.clone()
        rotary.sliding_attention_inv_freq.copy_(rotary.full_attention_inv_freq)
        one_base = hf(prompt).logits
        rotary.sliding_attention_inv_freq.copy_(local)
        for layer in hf.model.layers:
            layer.self_attn.scaling = hf.config.head_dim**-0.5
        default_scale = hf(prompt).logits
        for layer in hf.model.layers:
            layer.self_attn.scaling = hf.config.query_pre_attn_scalar**-0.5
    for other in (uncapped, one_base, default_scale):
        assert (base - other).abs().max() > 1e-3


def test_triton_kernels_through_the_native_backend(gemma):
    """The same parity on atom-kernels' Triton path: zero-centred q/k norms, each layer's rotary base and
    the softmax scale through the attention kernels."""
    assert_triton_matches_transformers(*gemma, prompts(6, (11, 4)))


def test_engine_chunks_prefix_hits_and_preemption_across_the_window(gemma):
    assert_engine_under_pressure(*gemma)


def test_the_multimodal_checkpoint_serves_its_language_model(gemma, tmp_path):
    """Gemma3ForConditionalGeneration's layout: text_config, the language model under model.language_model.*
    and a vision tower (skipped)."""
    hf, path = gemma
    text = json.loads((path / "config.json").read_text())
    text.pop("architectures")
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = {
        k.replace("model.", "model.language_model.", 1): v
        for k, v in load_file(path / "model.safetensors").items()
    }
    tensors["model.vision_tower.vision_model.post_layernorm.weight"] = torch.ones(8)
    tensors["model.multi_modal_projector.mm_input_projection_weight"] = torch.ones(8, 64)
    save_file(tensors, tmp_path / "model.safetensors")
    assert_matches_transformers(hf, tmp_path, prompts(1, (13, 3, 21)), steps=8)


def test_the_older_config_form_reads_as_transformers_reads_it(tmp_path):
    """rope_theta, rope_local_base_freq, rope_scaling (the global layers') and sliding_window_pattern, as the
    published Gemma 3 configs write them; head_dim left out."""
    fields = {k: v for k, v in GEMMA3_TINY.items() if k not in ("rope_parameters", "head_dim")}
    old = dict(fields, rope_theta=20000.0, rope_local_base_freq=50.0, sliding_window_pattern=3)
    old["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    hf = Gemma3TextConfig(**old)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForCausalLM"], **old}))
    atom = ModelConfig.from_pretrained(tmp_path)
    assert atom.head_dim == hf.head_dim == 256  # transformers' default, not hidden / heads
    assert (
        atom.hf["layer_types"]
        == hf.layer_types
        == ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    )
    for kind in ("full_attention", "sliding_attention"):
        want = hf.rope_parameters[kind]
        got = atom.hf["rope_parameters"][kind]
        assert (got["rope_theta"], got["rope_type"], got.get("factor")) == (
            want["rope_theta"],
            want["rope_type"],
            want.get("factor"),
        )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
        (dict(hidden_activation="relu"), "hidden_activation='relu'"),
        (dict(layer_types=["chunked_attention"] * 4), r"layer_types \['chunked_attention'\]"),
    ],
)
def test_fields_atom_cannot_compute_are_refused_by_name(fields, message):
    config = ModelConfig.from_hf_dict({"architectures": ["Gemma3ForCausalLM"], **GEMMA3_TINY, **fields})
    with pytest.raises(ConfigError, match=message):
        build_model(config, BuildContext(PagedAttentionBackend(kernel_backend="torch")))
