"""The plugin inside the real, pinned vLLM (no stubs). The shared gate logic is tested in atom-core."""

import logging
import subprocess
import sys
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version
from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

import atom_vllm
from atom_vllm.plugin import register

ACTIVE = f"ATOM plugin active: atom-vllm {atom_vllm.__version__}"


def test_the_installed_vllm_is_the_pinned_release():
    assert Version(metadata.version("vllm")) in SpecifierSet(atom_vllm.SUPPORTED_VLLM)


def test_vllms_plugin_loader_discovers_atom():
    assert load_plugins_by_group(DEFAULT_PLUGINS_GROUP)["atom"] is register


def test_at_vllm_startup_the_plugin_runs_and_its_line_is_in_vllms_log():
    # A fresh interpreter, as each vLLM process is: vLLM's default logging, then its general plugins.
    code = (
        "from vllm.config.logging import LoggingConfig\n"
        "from vllm.logger import configure_logging\n"
        "from vllm.plugins import load_general_plugins\n"
        "configure_logging(LoggingConfig())\n"
        "load_general_plugins()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    [line] = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ACTIVE in ln]
    assert f"on vllm {metadata.version('vllm')}" in line and "INFO" in line  # vLLM's own format


def test_the_version_guard_fires_on_another_vllm_release(installed_as, caplog):
    installed_as("vllm", "0.33.1")
    caplog.set_level(logging.INFO, logger="vllm.atom_vllm")
    assert register() is False
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"supports vllm {atom_vllm.SUPPORTED_VLLM}, but vllm==0.33.1 is installed" in error
    assert "ATOM_VLLM_SKIP_VERSION_CHECK=1" in error


def test_the_off_switch_leaves_vllm_untouched(monkeypatch):
    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN", "1")
    assert register() is False


def test_importing_the_entry_point_module_is_cheap():
    code = "import sys, atom_vllm.plugin; print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# Registration changes vLLM's process-wide registries, so each case runs in a fresh interpreter, as
# every vLLM process is one.
RESOLVE = """
import json
from vllm.plugins import load_general_plugins
load_general_plugins()
{extra}
from vllm import ModelRegistry
from vllm.v1.attention.backends.registry import AttentionBackendEnum, MambaAttentionBackendEnum
from atom_core.integration import supported_architectures
out = {{}}
drafts = ["DeepSeekMTPModel", "Glm4MoeMTPModel", "Qwen3NextMTP", "Qwen3_5MTP", "Qwen3_5MoeMTP"]
for arch in [*supported_architectures(), *drafts]:  # the ones ATOM does not serve stay vLLM's
    cls = ModelRegistry._try_load_model_cls(arch)
    info = ModelRegistry._try_inspect_model_cls(arch)
    out[arch] = [cls.__module__ + "." + cls.__qualname__, info.is_text_generation_model, info.is_hybrid]
out["backend"] = "ATOM" in AttentionBackendEnum.__members__ and AttentionBackendEnum["ATOM"].get_class().__qualname__
if "ATOM_MLA" in AttentionBackendEnum.__members__:
    mla = AttentionBackendEnum["ATOM_MLA"].get_class()
    out["mla_backend"] = [mla.__qualname__, mla.is_mla()]
if "ATOM_GDN" in MambaAttentionBackendEnum.__members__:
    gdn = MambaAttentionBackendEnum["ATOM_GDN"].get_class()
    out["gdn_backend"] = [gdn.__qualname__, gdn.is_ssm()]
print("RESULT" + json.dumps(out))
"""


def _resolve(extra: str = "", **env: str) -> dict:
    import json
    import os

    proc = subprocess.run(
        [sys.executable, "-c", RESOLVE.format(extra=extra)],
        capture_output=True,
        text=True,
        # vLLM inspects each of its own architectures in a subprocess of its own: ~14 imports of vLLM,
        # which took over 300 s on CI's two cores while the vLLM end-to-end suite ran beside it
        timeout=900,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    return json.loads(line.removeprefix("RESULT"))


def test_vllms_registry_resolves_every_atom_architecture_to_atom():
    from atom_core.integration import get_model_spec, supported_architectures
    from atom_vllm.registration import DRAFTS, LAYER_KINDS

    got = _resolve()
    served = supported_architectures(layer_kinds=LAYER_KINDS)
    assert set(served) == set(supported_architectures())  # every layer kind atom-core has is built here
    for arch in served:
        # vLLM's own inspection (in a subprocess of its own) accepts the class as a text-generation model,
        # and as a hybrid one (its state cache sized from the class) where the layers include GDN.
        hybrid = "gdn" in get_model_spec(arch).layer_kinds
        cls = "atom_vllm.hybrid.AtomHybridForCausalLM" if hybrid else "atom_vllm.model.AtomForCausalLM"
        assert got[arch] == [cls, True, hybrid], arch
    assert {"Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "DeepseekV3ForCausalLM"} <= set(served)
    for draft in DRAFTS:  # the architectures vLLM's speculative config writes for MTP drafts
        assert got[draft][0] == "atom_vllm.draft.AtomMTPDraft", draft
    assert got["backend"] == "AtomAttentionBackend"
    assert got["mla_backend"] == ["AtomMLABackend", True]
    assert got["gdn_backend"] == ["AtomGDNBackend", True]


def test_registering_twice_is_harmless():
    again = "from atom_vllm.plugin import PLUGIN\nPLUGIN.reset()\nassert PLUGIN.register()\nassert PLUGIN.register()"
    got = _resolve(extra=again)
    assert got["LlamaForCausalLM"] == ["atom_vllm.model.AtomForCausalLM", True, False]
    assert got["backend"] == "AtomAttentionBackend"


def test_switched_off_vllm_resolves_its_own_classes():
    got = _resolve(ATOM_DISABLE_VLLM_PLUGIN="1")
    assert got["LlamaForCausalLM"] == ["vllm.model_executor.models.llama.LlamaForCausalLM", True, False]
    assert got["Qwen3MoeForCausalLM"][0] == "vllm.model_executor.models.qwen3_moe.Qwen3MoeForCausalLM"
    assert got["Qwen3NextForCausalLM"][0] == "vllm.model_executor.models.qwen3_next.Qwen3NextForCausalLM"
    assert got["DeepSeekMTPModel"][0] == "vllm.model_executor.models.deepseek_mtp.DeepSeekMTP"
    assert got["backend"] is False and "mla_backend" not in got and "gdn_backend" not in got
