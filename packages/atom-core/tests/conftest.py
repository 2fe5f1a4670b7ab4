import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def atom_cache(tmp_path, monkeypatch):
    """A fresh, empty ATOM cache dir: what a machine with nothing cached has."""
    cache = tmp_path / "atom-cache"
    monkeypatch.setenv("ATOM_CACHE_DIR", str(cache))
    return cache
