import sys
from pathlib import Path

import pytest

# pytest runs with --import-mode=importlib, so the harness modules beside the tests are put on the path here.
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
    made = {}

    def get(architecture: str, **overrides):
        key = f"{architecture}{sorted(overrides.items())}"
        if key not in made:
            import torch
            import transformers
            from checkpoints import ARCHITECTURES

            family = architecture.removesuffix("ForCausalLM")
            config = getattr(transformers, f"{family}Config")(
                vocab_size=300,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                max_position_embeddings=256,
                **{**ARCHITECTURES[architecture], **overrides},
            )
            torch.manual_seed(0)
            path = tmp_path_factory.mktemp(family)
            transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
            made[key] = path
        return made[key]

    return get
