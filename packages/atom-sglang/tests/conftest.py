import sys
from pathlib import Path

import pytest

# pytest runs with --import-mode=importlib, so the modules beside the tests (sglang_support, sglang_harness)
# are put on the path here.
sys.path.insert(0, str(Path(__file__).parent))


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


@pytest.fixture(scope="session")
def checkpoint_for(tmp_path_factory):
    """checkpoint_for(architecture, **overrides): a random transformers checkpoint saved once per session
    (overrides change the architecture's tiny config, e.g. to add attention windows)."""
    from sglang_support import decisive_routing, random_checkpoint, tiny_config

    made = {}

    def get(architecture: str, **overrides):
        key = f"{architecture}{sorted(overrides.items())}"
        if key not in made:
            path = tmp_path_factory.mktemp(architecture.removesuffix("ForCausalLM"))
            edit = decisive_routing if architecture.startswith("Deepseek") else None
            made[key] = random_checkpoint(tiny_config(architecture, **overrides), path, edit=edit)[1]
        return made[key]

    return get
