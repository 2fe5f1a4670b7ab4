"""Per-layer attention windows, computed as transformers computes them or refused by name.

The ground truth for which layers slide, and by how much, is transformers' own model: each attention
module's `sliding_window`. Then parity: windows shorter than the prompts, layers mixing full and windowed
attention, and (in the engine) chunked prefill, prefix-cache hits and preemption crossing the window.
"""

import json

import pytest
import torch
from core_fixtures.architectures import TINY
from core_fixtures.engine import greedy_under_pressure
from core_fixtures.runner_driver import RunnerDriver
from transformers import LlamaConfig, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig

from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.loader import build_model
from tools.testing_models import random_checkpoint

BASE = dict(TINY, num_hidden_layers=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
WINDOWED = {
    # Qwen3: layers from max_window_layers on slide; the others are full.
    "qwen3-mixed": (
        Qwen3Config,
        dict(head_dim=16, use_sliding_window=True, sliding_window=5, max_window_layers=2),
    ),
    # Qwen3 with explicit layer_types (alternating), which win over max_window_layers.
    "qwen3-layer-types": (
        Qwen3Config,
        dict(
            head_dim=16,
            use_sliding_window=True,
            sliding_window=7,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
    ),
    # Qwen3-MoE: one window on every layer.
    "qwen3-moe-all": (Qwen3MoeConfig, dict(head_dim=16, use_sliding_window=True, sliding_window=6, **MOE)),
    # Qwen2-MoE: every other layer below max_window_layers.
    "qwen2-moe-alternating": (
        Qwen2MoeConfig,
        dict(
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=3,
            shared_expert_intermediate_size=40,
            **MOE,
        ),
    ),
}


def _hf_windows(hf_model) -> list:
    return [getattr(layer.self_attn, "sliding_window", None) for layer in hf_model.model.layers]


def _save(tmp_path, config_cls, overrides):
    return random_checkpoint(config_cls(**{**BASE, **overrides}), tmp_path / "ckpt")


def _atom_windows(path) -> list:
    config = ModelConfig.from_pretrained(path)
    model = build_model(config, BuildContext(PagedAttentionBackend(kernel_backend="torch")))
    return [layer.self_attn.attn.spec.sliding_window for layer in model.model.layers]


def _strip(path, *keys):
    """Rewrite config.json without keys transformers derived when it saved (as published configs are)."""
    config = json.loads((path / "config.json").read_text())
    for key in keys:
        config.pop(key, None)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("config_cls", "overrides"),
    [
        (Qwen3Config, dict(use_sliding_window=True, sliding_window=5, max_window_layers=1)),
        (Qwen3Config, dict(use_sliding_window=True, sliding_window=5, max_window_layers=9)),  # none reach it
        (Qwen3Config, dict(use_sliding_window=False, sliding_window=5, max_window_layers=0)),
        (Qwen3Config, dict(use_sliding_window=True, sliding_window=None, max_window_layers=0)),
        (Qwen3MoeConfig, dict(use_sliding_window=True, sliding_window=9, max_window_layers=2, **MOE)),
        (Qwen3MoeConfig, dict(use_sliding_window=False, sliding_window=9, **MOE)),
        (Qwen2MoeConfig, dict(use_sliding_window=True, sliding_window=3, max_window_layers=4, **MOE)),
        (Qwen2MoeConfig, dict(use_sliding_window=True, sliding_window=3, max_window_layers=1, **MOE)),
        (Qwen2MoeConfig, dict(use_sliding_window=False, sliding_window=3, **MOE)),
        (LlamaConfig, {}),
    ],
)
def test_each_layer_gets_the_window_transformers_gives_it(tmp_path, config_cls, overrides):
    hf, path = _save(tmp_path, config_cls, overrides)
    expected = _hf_windows(hf)
    assert _atom_windows(path) == expected  # from the config transformers saved (layer_types included)
    _strip(path, "layer_types")  # and from the fields alone, as published checkpoints have them
    assert _atom_windows(path) == expected


@pytest.mark.parametrize("case", list(WINDOWED))
def test_windowed_models_match_transformers_past_the_window(tmp_path, hf_greedy_tokens, case):
    config_cls, overrides = WINDOWED[case]
    hf, path = _save(tmp_path, config_cls, overrides)
    windows = _hf_windows(hf)
    assert any(w is not None for w in windows)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 211, (n,), generator=gen).tolist() for n in (13, 3, 21)]
    prefill, generated = RunnerDriver(path).greedy(prompts, steps=32)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(prefill[i], ref, rtol=0, atol=1e-4 * max(ref.abs().max().item(), 1.0))
        assert generated[i] == hf_greedy_tokens(hf, prompt, 32), f"prompt {i} diverged from transformers"


def test_the_window_changes_the_answer(tmp_path):
    """Guards the parity test above: the same weights without the window give other logits past it."""
    hf, path = _save(tmp_path, *WINDOWED["qwen3-mixed"])
    prompt = torch.randint(1, 211, (17,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        windowed = hf(torch.tensor([prompt])).logits[0]
    _strip(path, "layer_types", "use_sliding_window")
    full, _ = RunnerDriver(path).greedy([prompt], steps=1)
    assert (full[0][-1] - windowed[-1]).abs().max() > 1e-2


def test_engine_chunks_prefix_hits_and_preemption_across_the_window(tmp_path, hf_greedy_tokens):
    hf, path = _save(tmp_path, *WINDOWED["qwen3-mixed"])
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(1, 211, (13,), generator=gen).tolist()  # three 4-token blocks: a prefix hit
    prompts = [[*shared, 7, 8], [*shared, 9], torch.randint(1, 211, (29,), generator=gen).tolist(), [4, 5]]
    greedy_under_pressure(path, hf, hf_greedy_tokens, prompts)


def _config(architecture, **fields):
    return ModelConfig.from_hf_dict({"architectures": [architecture], **BASE, **fields})


@pytest.mark.parametrize(
    ("architecture", "fields", "message"),
    [
        (
            "Qwen3ForCausalLM",
            dict(layer_types=["chunked_attention"] * 4, use_sliding_window=True),
            "layer_types \\['chunked_attention'\\]",
        ),
        ("Qwen3ForCausalLM", dict(layer_types=["full_attention"] * 3), "one kind per layer \\(4\\)"),
        (
            "Qwen3ForCausalLM",
            dict(layer_types=["sliding_attention"] * 4, use_sliding_window=False),
            "asks for sliding_attention but the window is None",
        ),
        (
            "Qwen3ForCausalLM",
            dict(use_sliding_window=True, sliding_window=0, max_window_layers=0),
            "window is 0",
        ),
        ("Qwen2MoeForCausalLM", dict(use_sliding_window=True, sliding_window=-1, **MOE), "window is -1"),
        # transformers' Llama ignores it in a forward but its cache keeps only the window: no one answer
        ("LlamaForCausalLM", dict(sliding_window=6), "sets sliding_window=6"),
    ],
)
def test_window_fields_atom_cannot_compute_are_refused_by_name(architecture, fields, message):
    config = _config(architecture, **fields)
    with pytest.raises(ConfigError, match=message):
        build_model(config, BuildContext(PagedAttentionBackend(kernel_backend="torch")))


def test_an_activation_other_than_silu_is_refused_by_name():
    with pytest.raises(ConfigError, match="hidden_act 'gelu' is not supported"):
        _config("LlamaForCausalLM", hidden_act="gelu")
