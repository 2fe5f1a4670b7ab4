"""Mixtral against transformers: the published per-expert layout (block_sparse_moe.experts.E.w1/w2/w3) and the
fused one transformers 5 keeps in memory, a softmax router renormalised over its top 2, a sliding window
shorter than the prompts on every layer, and randomized norms. Then the engine (chunked prefill, prefix
hits, preemption) and refusals by name."""

import pytest
import torch
from core_fixtures.family import (
    assert_engine_under_pressure,
    assert_matches_transformers,
    assert_triton_matches_transformers,
    prompts,
)
from safetensors.torch import load_file, save_file
from transformers import MixtralConfig

from atom_core import LLM
from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.loader import CheckpointError, build_model
from tools.testing_models import TINY_ARCHITECTURES, TINY_DIMS, random_checkpoint

MIXTRAL_TINY = dict(
    TINY_DIMS, **TINY_ARCHITECTURES["MixtralForCausalLM"], vocab_size=211, num_hidden_layers=3
)


def _trained_like(model) -> None:
    """Routers with a trained model's margins (random ones, std 0.02, tie experts within float noise) and
    norm weights as a trained model has them (transformers draws ones, which would hide a norm that
    dropped its weight)."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.mul_(25.0)
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn(param.shape, generator=gen))


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixtral") / "ckpt"
    return random_checkpoint(MixtralConfig(**MIXTRAL_TINY), path, edit=_trained_like)


def test_logits_and_greedy_tokens_match_transformers(mixtral):
    hf, path = mixtral
    assert hf.config.sliding_window == MIXTRAL_TINY["sliding_window"] < 13
    assert "model.layers.0.block_sparse_moe.experts.3.w3.weight" in load_file(path / "model.safetensors")
    assert_matches_transformers(hf, path, prompts(1, (13, 3, 21)))  # two prompts past the window


def test_the_fused_expert_layout_loads_too(mixtral, tmp_path):
    """transformers 5's in-memory names: mlp.gate and mlp.experts.{gate_up_proj [E, 2I, H], down_proj}."""
    hf, path = mixtral
    tensors = load_file(path / "model.safetensors")
    fused = {k: v for k, v in tensors.items() if ".block_sparse_moe." not in k}
    experts = MIXTRAL_TINY["num_local_experts"]
    for i in range(MIXTRAL_TINY["num_hidden_layers"]):
        moe = f"model.layers.{i}.block_sparse_moe"
        each = [
            [tensors[f"{moe}.experts.{e}.{w}.weight"] for e in range(experts)] for w in ("w1", "w3", "w2")
        ]
        fused[f"model.layers.{i}.mlp.gate.weight"] = tensors[f"{moe}.gate.weight"]
        fused[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.cat(
            [torch.stack(each[0]), torch.stack(each[1])], dim=1
        )
        fused[f"model.layers.{i}.mlp.experts.down_proj"] = torch.stack(each[2])
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    save_file(fused, tmp_path / "model.safetensors")
    assert_matches_transformers(hf, tmp_path, prompts(1, (13, 3, 21)), steps=8)


def test_the_window_and_the_renormalised_router_change_the_answer(mixtral):
    """Guards the parity above: without the window, or without renormalising the top 2, the same model gives
    other logits (so a model that ignored either could not pass)."""
    hf, _ = mixtral
    prompt = torch.tensor([prompts(2, (15,))[0]])
    with torch.no_grad():
        base = hf(prompt).logits
        hf.config.sliding_window = None
        hf.model.config.sliding_window = None
        full = hf(prompt).logits
        hf.config.sliding_window = hf.model.config.sliding_window = MIXTRAL_TINY["sliding_window"]
        forward = type(hf.model.layers[0].mlp.gate).forward

        def unnormalised(self, x):
            logits = torch.nn.functional.linear(x.reshape(-1, self.hidden_dim), self.weight)
            probs, index = torch.softmax(logits.float(), dim=-1).topk(self.top_k, dim=-1)
            return logits, probs, index

        type(hf.model.layers[0].mlp.gate).forward = unnormalised
        try:
            raw = hf(prompt).logits
        finally:
            type(hf.model.layers[0].mlp.gate).forward = forward
    assert (base[0, -1] - full[0, -1]).abs().max() > 1e-3
    assert (base - raw).abs().max() > 1e-3  # ten times the parity tests' tolerance


def test_triton_kernels_through_the_native_backend(mixtral):
    """The same parity on atom-kernels' Triton path: windowed paged attention and the expert GEMMs."""
    assert_triton_matches_transformers(*mixtral, prompts(6, (11, 4)))


def test_engine_chunks_prefix_hits_and_preemption_across_the_window(mixtral):
    assert_engine_under_pressure(*mixtral)


def _atom_model(config: ModelConfig):
    return build_model(config, BuildContext(PagedAttentionBackend(kernel_backend="torch")))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(sliding_window=0), "window is 0"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    ],
)
def test_fields_atom_cannot_compute_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        _atom_model(
            ModelConfig.from_hf_dict({"architectures": ["MixtralForCausalLM"], **MIXTRAL_TINY, **fields})
        )


def test_a_missing_expert_is_named(mixtral, tmp_path):
    _, path = mixtral
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing tensors for: model\.layers\.1\.mlp\.w13$"):
        LLM(tmp_path, kernel_backend="torch")
