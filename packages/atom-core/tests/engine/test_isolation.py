"""Two models in one process, each in its own engine runner with its own cache layout, run interleaved without
interfering."""

import pytest
from core_fixtures.architectures import TINY
from core_fixtures.runner_driver import RunnerDriver
from transformers import LlamaConfig, Qwen3Config

from atom_core.forward_context import current_forward_context
from tools.testing_models import random_checkpoint

SMALL = dict(TINY, vocab_size=80, hidden_size=32, intermediate_size=48)
LAYOUTS = {"target": "flash", "draft": "shuffle"}


def _saved(tmp_path, cls, name, seed, **kw):
    return random_checkpoint(cls(**SMALL, **kw), tmp_path / name, seed=seed)[1]


def test_target_and_draft_interleaved_equal_each_alone(tmp_path):
    paths = {
        "target": _saved(tmp_path, LlamaConfig, "target", 0),
        "draft": _saved(tmp_path, Qwen3Config, "draft", 1, head_dim=8),
    }
    prompts = {"target": [3, 14, 15, 9, 26, 53], "draft": [5, 8, 9, 7, 9, 3, 2, 3]}

    def run(name):
        return RunnerDriver(paths[name], seed=len(name), kv_layout=LAYOUTS[name])

    alone = {name: run(name).greedy([prompts[name]], steps=8)[1][0] for name in ("target", "draft")}

    target, draft = run("target"), run("draft")
    assert draft.runner.cache.layout == "shuffle" and target.runner.cache.layout == "flash"
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
