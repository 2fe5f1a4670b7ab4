"""The plugin inside the real, pinned SGLang (no stubs). The shared gate logic is tested in atom-core.

SGLang's engine needs CUDA; these tests use the parts of SGLang that run on the CPU: its plugin loader,
its model registry and its server-argument parser.
"""

import logging
import os
import subprocess
import sys
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

import atom_sglang
from atom_core.integration import supported_architectures
from atom_sglang.plugin import register
from atom_sglang.specs import served_architectures


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


def test_the_installed_sglang_is_the_pinned_release():
    assert Version(metadata.version("sglang")) in SpecifierSet(atom_sglang.SUPPORTED_SGLANG)


def test_sglangs_plugin_loader_discovers_atom():
    func, dist = load_plugins_by_group(GENERAL_PLUGINS_GROUP)["atom"]
    assert func is register and dist == "atom-sglang"


def test_at_sglang_startup_the_plugin_runs_and_logs_that_atom_is_active():
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from sglang.srt.plugins import load_plugins; load_plugins()\n"
        "from atom_sglang.plugin import PLUGIN; print(PLUGIN._active)"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert f"ATOM plugin active: atom-sglang {atom_sglang.__version__}" in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "True"  # decided by SGLang's own call


RESOLVE = (
    "from sglang.srt.models.registry import ModelRegistry, import_model_classes\n"
    "found = import_model_classes('atom_sglang.models', strict=True)\n"
    "assert all(ModelRegistry.models[k] is v for k, v in found.items())\n"
    "print(sorted(found))\n"
    "for arch in {archs!r}:\n"
    "    cls, _ = ModelRegistry.resolve_model_cls([arch])\n"
    "    print(arch, cls.__module__, cls.__name__)\n"
)


def test_sglangs_registry_resolves_every_atom_architecture_to_atoms_wrapper():
    # With the variable set, SGLang's registry imports atom_sglang.models at import time; strict here,
    # so an import error in any wrapper module fails the test.
    archs = served_architectures()
    # every architecture atom-core builds (MHA, MLA and the GDN hybrids), and SGLang's names of their drafts
    drafts = {"DeepseekV3ForCausalLMNextN", "Qwen3NextForCausalLMMTP", "Qwen3_5ForCausalLMMTP"}
    assert set(archs) == {*supported_architectures(), *drafts}
    proc = _python(
        RESOLVE.format(archs=archs), SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.EXTERNAL_MODEL_PACKAGE
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()[-len(archs) - 1 :]
    assert lines[0] == str(sorted(archs))
    assert lines[1:] == [f"{arch} atom_sglang.models.atom {arch}" for arch in archs]


MODEL_CONFIG = (
    "from sglang.srt.configs.model_config import AttentionArch, ModelConfig\n"
    "from sglang.srt.models.registry import ModelRegistry\n"
    "for draft in (False, True):\n"
    "    config = ModelConfig({path!r}, is_draft_model=draft, speculative_algorithm='EAGLE')\n"
    "    cls, arch = ModelRegistry.resolve_model_cls(config.hf_config.architectures)\n"
    "    print(arch, cls.__module__, config.attention_arch == AttentionArch.MLA, config.kv_lora_rank)\n"
)


def test_sglangs_model_config_takes_deepseek_and_its_draft_to_atom_as_mla(checkpoint_for):
    # SGLang decides MLA (and so the latent pool and `atom`'s MLA backend) and renames the draft from the
    # checkpoint's architecture name; both names resolve to ATOM's wrappers.
    path = str(checkpoint_for("DeepseekV3ForCausalLM", num_nextn_predict_layers=1))
    proc = _python(
        MODEL_CONFIG.format(path=path), SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.EXTERNAL_MODEL_PACKAGE
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-2:] == [
        "DeepseekV3ForCausalLM atom_sglang.models.atom True 32",
        "DeepseekV3ForCausalLMNextN atom_sglang.models.atom True 32",
    ]


def test_switched_off_sglang_resolves_its_own_models():
    proc = _python(
        RESOLVE.format(archs=("LlamaForCausalLM",)),
        SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.EXTERNAL_MODEL_PACKAGE,
        ATOM_DISABLE_SGLANG_PLUGIN="1",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-2:] == [
        "[]",
        "LlamaForCausalLM sglang.srt.models.llama LlamaForCausalLM",
    ]


SERVER_ARGS = (
    "from sglang.srt.plugins import load_plugins; load_plugins()\n"
    "from sglang.srt.server_args import prepare_server_args\n"
    "from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS\n"
    "args = prepare_server_args(['--model-path', {path!r}, '--attention-backend', 'atom', '--device', 'cpu'])\n"
    "print(args.attention_backend, ATTENTION_BACKENDS['atom'].__module__)\n"
)


def test_the_backend_is_selectable_by_name_through_sglangs_own_argument_parser(checkpoint_for):
    path = str(checkpoint_for("LlamaForCausalLM"))
    proc = _python(SERVER_ARGS.format(path=path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "atom atom_sglang.registration"
    off = _python(SERVER_ARGS.format(path=path), ATOM_DISABLE_SGLANG_PLUGIN="1")
    assert off.returncode != 0 and "invalid choice: 'atom'" in off.stderr  # registered by the plugin only


def test_the_version_guard_fires_on_another_sglang_release(installed_as, caplog):
    installed_as("sglang", "0.5.24")
    caplog.set_level(logging.INFO, logger="atom_sglang")
    assert register() is False
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"supports sglang {atom_sglang.SUPPORTED_SGLANG}, but sglang==0.5.24 is installed" in error


def test_the_off_switch_leaves_sglang_untouched(monkeypatch):
    monkeypatch.setenv("ATOM_DISABLE_SGLANG_PLUGIN", "1")
    assert register() is False


def test_importing_the_entry_point_module_is_cheap():
    out = _python(
        "import sys, atom_sglang.plugin; print(sorted(m for m in ('sglang', 'torch') if m in sys.modules))"
    )
    assert out.stdout.strip() == "[]"
