"""Two models in one process, built with different attention backends, run interleaved without interfering."""

import pytest
from core_support import TINY, random_checkpoint
from transformers import LlamaConfig, Qwen3Config

from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.forward_context import current_forward_context
from atom_core.loader import build_model, load_checkpoint

SMALL = dict(TINY, vocab_size=80, hidden_size=32, intermediate_size=48)


def _saved(tmp_path, cls, name, seed, **kw):
    return random_checkpoint(cls(**SMALL, **kw), tmp_path / name, seed=seed)[1]


def _load(path, backend):
    config = ModelConfig.from_pretrained(path)
    model = build_model(config, BuildContext(backend))
    load_checkpoint(model, path)
    return model, config


def test_target_and_draft_interleaved_equal_each_alone(tmp_path, paged_runner):
    target_path = _saved(tmp_path, LlamaConfig, "target", 0)
    draft_path = _saved(tmp_path, Qwen3Config, "draft", 1, head_dim=8)
    prompts = {"target": [3, 14, 15, 9, 26, 53], "draft": [5, 8, 9, 7, 9, 3, 2, 3]}

    def run(name, path, backend):
        model, config = _load(path, backend)
        return paged_runner(model, config, seed=len(name), layout=backend.layout)

    alone = {}
    for name, path, backend in (
        ("target", target_path, PagedAttentionBackend(kernel_backend="torch")),
        ("draft", draft_path, PagedAttentionBackend(layout="shuffle", kernel_backend="torch")),
    ):
        runner = run(name, path, backend)
        alone[name] = runner.greedy([prompts[name]], steps=8)[1][0]

    target = run("target", target_path, PagedAttentionBackend(kernel_backend="torch"))
    draft = run("draft", draft_path, PagedAttentionBackend(layout="shuffle", kernel_backend="torch"))
    out = {
        "target": [int(target.step({0: prompts["target"]})[0][-1].argmax())],
        "draft": [int(draft.step({0: prompts["draft"]})[0][-1].argmax())],
    }
    for _ in range(7):  # alternate single steps: each model binds its own ForwardContext per forward
        out["draft"].append(int(draft.step({0: [out["draft"][-1]]})[0][-1].argmax()))
        out["target"].append(int(target.step({0: [out["target"][-1]]})[0][-1].argmax()))
    assert out == alone


def test_no_context_outside_a_forward():
    with pytest.raises(RuntimeError, match="no ForwardContext is bound"):
        current_forward_context()
