"""The plugin inside the real, pinned SGLang (no stubs). The shared gate logic is tested in atom-core.

SGLang's engine needs CUDA; these tests use the parts of SGLang that run on the CPU: its plugin loader,
its model registry and its server-argument parser.
"""

import logging
import os
import subprocess
import sys
from importlib import metadata

import pytest
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


RUN_PARTS = """
import sys, traceback
for name, code in {parts!r}:
    print("@@part " + name, flush=True)
    print("@@part " + name, file=sys.stderr, flush=True)
    try:
        exec(code, {{}})
        print("@@exit 0", flush=True)
    except SystemExit as e:
        print("@@exit " + str(e.code), flush=True)
    except BaseException:
        traceback.print_exc()
        print("@@exit 1", flush=True)
"""


def _split(text: str) -> dict[str, str]:
    parts, name = {}, None
    for line in text.splitlines():
        if line.startswith("@@part "):
            name = line[len("@@part ") :]
            parts[name] = []
        elif name is not None:
            parts[name].append(line)
    return {k: "\n".join(v) for k, v in parts.items()}


class Part:
    """One snippet's share of a process that ran several: its stdout, stderr and exit code."""

    def __init__(self, out: str, err: str):
        lines = out.splitlines()
        self.returncode = int(lines[-1].split()[1]) if lines and lines[-1].startswith("@@exit ") else -1
        self.stdout, self.stderr = "\n".join(lines[:-1]), err


def _python_parts(parts: dict[str, str], **env: str) -> dict[str, Part]:
    """Run the snippets one after another in one fresh interpreter (SGLang's import is what costs: ~30 s
    a process on the CI's cores) -> each snippet's output. A SystemExit ends only its snippet."""
    proc = _python(RUN_PARTS.format(parts=list(parts.items())), **env)
    out, err = _split(proc.stdout), _split(proc.stderr)
    return {name: Part(out.get(name, ""), err.get(name, "") or proc.stderr) for name in parts}


def test_the_installed_sglang_is_the_pinned_release():
    assert Version(metadata.version("sglang")) in SpecifierSet(atom_sglang.SUPPORTED_SGLANG)


def test_sglangs_plugin_loader_discovers_atom():
    func, dist = load_plugins_by_group(GENERAL_PLUGINS_GROUP)["atom"]
    assert func is register and dist == "atom-sglang"


STARTUP = (
    "import logging; logging.basicConfig(level=logging.INFO)\n"
    "from sglang.srt.plugins import load_plugins; load_plugins()\n"
    "from atom_sglang.plugin import PLUGIN; print(PLUGIN._active)"
)
SERVER_ARGS = (
    "from sglang.srt.plugins import load_plugins; load_plugins()\n"
    "from sglang.srt.server_args import prepare_server_args\n"
    "from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS\n"
    "args = prepare_server_args(['--model-path', {path!r}, '--attention-backend', 'atom', '--device', 'cpu'])\n"
    "print(args.attention_backend, ATTENTION_BACKENDS['atom'].__module__)\n"
)


@pytest.fixture(scope="module")
def plugin_on(checkpoint_for):
    """SGLang's startup with the plugin, then its server-argument parser, in one process."""
    path = str(checkpoint_for("LlamaForCausalLM"))
    return _python_parts({"startup": STARTUP, "server_args": SERVER_ARGS.format(path=path)})


def test_at_sglang_startup_the_plugin_runs_and_logs_that_atom_is_active(plugin_on):
    proc = plugin_on["startup"]
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


MODEL_CONFIG = (
    "from sglang.srt.configs.model_config import AttentionArch, ModelConfig\n"
    "from sglang.srt.models.registry import ModelRegistry\n"
    "for draft in (False, True):\n"
    "    config = ModelConfig({path!r}, is_draft_model=draft, speculative_algorithm='EAGLE')\n"
    "    cls, arch = ModelRegistry.resolve_model_cls(config.hf_config.architectures)\n"
    "    print(arch, cls.__module__, config.attention_arch == AttentionArch.MLA, config.kv_lora_rank)\n"
)


@pytest.fixture(scope="module")
def external_models(checkpoint_for):
    """SGLang's registry with ATOM's model package named, then its model config of a DeepSeek-V3
    checkpoint, in one process. With the variable set, the registry imports atom_sglang.models at import
    time; strict here, so an import error in any wrapper module fails."""
    path = str(checkpoint_for("DeepseekV3ForCausalLM", num_nextn_predict_layers=1))
    parts = {
        "resolve": RESOLVE.format(archs=served_architectures()),
        "model_config": MODEL_CONFIG.format(path=path),
    }
    return _python_parts(parts, SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.EXTERNAL_MODEL_PACKAGE)


@pytest.fixture(scope="module")
def plugin_off(checkpoint_for):
    """The same registry and argument parser with ATOM switched off, in one process."""
    path = str(checkpoint_for("LlamaForCausalLM"))
    parts = {
        "resolve": RESOLVE.format(archs=("LlamaForCausalLM",)),
        "server_args": SERVER_ARGS.format(path=path),
    }
    return _python_parts(
        parts,
        SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.EXTERNAL_MODEL_PACKAGE,
        ATOM_DISABLE_SGLANG_PLUGIN="1",
    )


def test_sglangs_registry_resolves_every_atom_architecture_to_atoms_wrapper(external_models):
    archs = served_architectures()
    # every architecture atom-core builds (MHA, MLA and the GDN hybrids), and SGLang's names of their drafts
    drafts = {
        "DeepseekV3ForCausalLMNextN",
        "Glm4MoeForCausalLMNextN",
        "Qwen3NextForCausalLMMTP",
        "Qwen3_5ForCausalLMMTP",
    }
    assert set(archs) == {*supported_architectures(), *drafts}
    proc = external_models["resolve"]
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()[-len(archs) - 1 :]
    assert lines[0] == str(sorted(archs))
    assert lines[1:] == [f"{arch} atom_sglang.models.atom {arch}" for arch in archs]


def test_sglangs_model_config_takes_deepseek_and_its_draft_to_atom_as_mla(external_models):
    # SGLang decides MLA (and so the latent pool and `atom`'s MLA backend) and renames the draft from the
    # checkpoint's architecture name; both names resolve to ATOM's wrappers.
    proc = external_models["model_config"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-2:] == [
        "DeepseekV3ForCausalLM atom_sglang.models.atom True 32",
        "DeepseekV3ForCausalLMNextN atom_sglang.models.atom True 32",
    ]


def test_switched_off_sglang_resolves_its_own_models(plugin_off):
    proc = plugin_off["resolve"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-2:] == [
        "[]",
        "LlamaForCausalLM sglang.srt.models.llama LlamaForCausalLM",
    ]


def test_the_backend_is_selectable_by_name_through_sglangs_own_argument_parser(plugin_on, plugin_off):
    proc = plugin_on["server_args"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "atom atom_sglang.registration"
    off = plugin_off["server_args"]
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
