import pytest


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
