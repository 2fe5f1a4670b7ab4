"""The layering contracts fail when the layering is broken: violations planted in a copy of the workspace."""

import shutil
from pathlib import Path

import pytest

from tools.lint_imports import REPO, lint_imports


@pytest.fixture
def workspace(tmp_path) -> Path:
    root = tmp_path / "ws"
    (root / "packages").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for pkg in (REPO / "packages").iterdir():
        shutil.copytree(pkg / "src", root / "packages" / pkg.name / "src")
    return root


def _plant(root: Path, module: str, line: str) -> None:
    package, _, _ = module.partition(".")
    dist = package.replace("_", "-")
    path = root / "packages" / dist / "src" / Path(*module.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + f"\n{line}\n" if path.exists() else f"{line}\n")


def test_the_real_workspace_keeps_every_contract():
    proc = lint_imports()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("atom_core.bad", "import vllm", "atom_core never imports an engine or an adapter"),
        ("atom_core.bad", "import atom_sglang", "atom_core never imports an engine or an adapter"),
        ("atom_kernels.bad", "import atom_core", "atom_kernels imports nothing of ours and no engine"),
        ("atom_vllm.bad", "import atom_kernels", "Adapters never import atom_kernels directly"),
        ("atom_sglang.bad", "from atom_kernels import silu_and_mul", "Adapters never import atom_kernels"),
        ("atom_vllm.bad", "import sglang", "atom_vllm never imports sglang"),
        ("atom_sglang.bad", "import vllm.plugins", "atom_sglang never imports vllm"),
        ("atom_sglang.bad", "import atom_vllm", "Layers: adapters above atom_core above atom_kernels"),
        ("atom_vllm.bad", "from atom_core.demo import ensure_demo_checkpoint", "only atom_core's public API"),
        ("atom_sglang.bad", "import atom_core.integration.version", "only atom_core's public API"),
        # composing a stateful layer kind's step from kernel ops instead of calling atom-core's step
        ("atom_vllm.attention.bad", "from atom_core.ops import causal_conv1d", "only atom_core's public API"),
        (
            "atom_sglang.attention.bad",
            "from atom_core.ops import write_latent",
            "only atom_core's public API",
        ),
        (
            "atom_sglang.bad",
            "from atom_core.attention.gdn_step import _slot_step",
            "only atom_core's public API",
        ),
    ],
)
def test_a_planted_violation_breaks_its_contract(workspace, module, line, broken):
    _plant(workspace, module, line)
    proc = lint_imports(workspace)
    assert proc.returncode != 0
    broken_lines = [ln for ln in proc.stdout.splitlines() if " BROKEN" in ln]
    assert any(broken in ln for ln in broken_lines), proc.stdout


@pytest.mark.parametrize("line", ["import atom_core", "from atom_core.integration import adapter_gate"])
def test_the_public_api_is_allowed_to_adapters(workspace, line):
    _plant(workspace, "atom_vllm.good", line)
    proc = lint_imports(workspace)
    assert proc.returncode == 0, proc.stdout
