import pytest


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test sees a process where SGLang has not called register() yet, with no ATOM env set."""
    monkeypatch.delenv("ATOM_DISABLE_SGLANG_PLUGIN", raising=False)
    monkeypatch.delenv("ATOM_SGLANG_SKIP_VERSION_CHECK", raising=False)
    # Imported here: pytest loads this file even where the root conftest delegates these tests.
    from atom_sglang.plugin import PLUGIN

    PLUGIN.reset()
    yield
    PLUGIN.reset()
