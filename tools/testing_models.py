"""Test helpers every environment's tests share (atom-core's, atom-vllm's and atom-sglang's support modules
re-export them): random checkpoints built locally (no model hub) and free localhost ports.

The repository root is on sys.path in every test environment (the root pyproject's pytest pythonpath), so
this module is importable there; it needs only torch and transformers, which every environment has.
"""

from __future__ import annotations

import socket
from pathlib import Path


def random_checkpoint(config, path: Path, *, seed: int = 0, max_shard_size=None, dtype=None):
    """transformers' model of `config` (any model config) with random weights drawn after
    torch.manual_seed(seed), saved to `path` (in shards of at most `max_shard_size` if given).
    Returns (the model in eval mode, path)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, **({} if dtype is None else {"dtype": dtype})).eval()
    model.save_pretrained(path, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
    return model, path


def free_port() -> int:
    """A localhost TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
