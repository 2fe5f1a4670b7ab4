"""Tiny random checkpoints saved by transformers, with a tokenizer trained here (no model hub), and
transformers' own greedy continuations as the ground truth (the helpers are in ../vllm_support.py)."""

import pytest
from vllm_support import Checkpoint, save_checkpoint, transformers_greedy, transformers_windows


@pytest.fixture(scope="session")
def checkpoint_for(tmp_path_factory):
    """checkpoint_for(architecture, **config_kwargs): saved once per architecture and config per session."""
    made: dict[str, Checkpoint] = {}

    def get(architecture: str, **config_kwargs) -> Checkpoint:
        key = f"{architecture}{sorted(config_kwargs.items())}"
        if key not in made:
            path = tmp_path_factory.mktemp(architecture) / "ckpt"
            made[key] = save_checkpoint(architecture, path, config_kwargs)
        return made[key]

    return get


@pytest.fixture(scope="session")
def greedy_reference():
    """greedy_reference(checkpoint, prompt, steps) -> transformers' greedy tokens."""
    return lambda ckpt, prompt, steps: transformers_greedy(ckpt.path, prompt, steps)


@pytest.fixture(scope="session")
def windows_reference():
    """windows_reference(checkpoint) -> each layer's window in transformers' model of it."""
    return lambda ckpt: transformers_windows(ckpt.path)
