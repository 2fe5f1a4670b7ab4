"""One Qwen3.5 checkpoint in the layouts it ships in gives the same tokens: saved as the published
...ForConditionalGeneration (text weights under model.language_model.*, a vision tower, text_config) and
re-saved as the text model; Qwen3.5-MoE with per-expert keys and re-saved with fused 3-D experts."""

import json
import shutil

import pytest
import torch
from core_fixtures.references import torch_reference_ops
from safetensors.torch import load_file, save_file

from atom_core.engine import LLM, SamplingParams
from tools.testing_qwen import qwen3_next_checkpoint


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops_on_the_cpu():
    """On the CPU every op runs its torch reference (see test_qwen3_next_parity.py)."""
    with torch_reference_ops():
        yield


PROMPTS = [
    [5, 17, 42, 9, 100, 3, 77, 31, 2, 8, 64, 19, 150],
    [8, 8, 150],
    [(7 * i) % 190 + 2 for i in range(70)],
]
PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)


def outputs(path):
    llm = LLM(path, kernel_backend="torch", dtype="float32", block_size=4, max_num_batched_tokens=24)
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)]


def assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        for lg, lw in zip(g.logprobs, w.logprobs, strict=True):
            assert lg.keys() == lw.keys() and max(abs(lg[t] - lw[t]) for t in lg) < 1e-5


def resave(src, dst, tensors: dict, config: dict) -> None:
    shutil.copytree(src, dst)
    (dst / "model.safetensors").unlink()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=1))


def test_conditional_generation_and_text_model_layouts_give_equal_tokens(tmp_path):
    vl = tmp_path / "vl"
    qwen3_next_checkpoint(vl, "qwen3.5-conditional-generation")
    tensors = load_file(vl / "model.safetensors")
    assert any(k.startswith("model.visual.") for k in tensors)
    text = {
        k.replace("model.language_model.", "model.", 1): v
        for k, v in tensors.items()
        if not k.startswith("model.visual.")
    }
    config = json.loads((vl / "config.json").read_text())
    text_config = {
        **config["text_config"],
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
    }
    resave(vl, tmp_path / "text", text, text_config)
    assert_same(outputs(tmp_path / "text"), outputs(vl))


def test_per_expert_and_fused_expert_layouts_give_equal_tokens(tmp_path):
    per_expert = tmp_path / "per-expert"
    model = qwen3_next_checkpoint(per_expert, "qwen3.5-moe")
    tensors, experts = load_file(per_expert / "model.safetensors"), model.config.num_experts
    for layer in range(model.config.num_hidden_layers):
        p = f"model.layers.{layer}.mlp.experts"
        gate, up, down = (
            [tensors.pop(f"{p}.{e}.{w}_proj.weight") for e in range(experts)] for w in ("gate", "up", "down")
        )
        tensors[f"{p}.gate_up_proj"] = torch.stack([torch.cat(pair) for pair in zip(gate, up, strict=True)])
        tensors[f"{p}.down_proj"] = torch.stack(down)
    resave(per_expert, tmp_path / "fused", tensors, json.loads((per_expert / "config.json").read_text()))
    assert_same(outputs(tmp_path / "fused"), outputs(per_expert))
