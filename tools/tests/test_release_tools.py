import datetime
import shutil
from pathlib import Path

import pytest

from tools.check_versions import problems
from tools.release import main as release_main
from tools.release import next_version, prepare
from tools.workspace import REPO, packages


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "ws"
    for pkg in (REPO / "packages").iterdir():
        dest = root / "packages" / pkg.name
        shutil.copytree(pkg, dest, ignore=shutil.ignore_patterns("tests", "benchmarks", "__pycache__"))
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def test_the_real_workspace_is_consistent():
    assert problems() == []


def test_version_mismatch_with_init_is_named(root):
    _edit(
        root / "packages/atom-core/src/atom_core/__init__.py",
        '__version__ = "0.1.0"',
        '__version__ = "0.1.1"',
    )
    assert problems(root) == ["atom-core: pyproject version 0.1.0 but __version__ = 0.1.1"]


def test_exact_pin_between_siblings_is_refused(root):
    _edit(root / "packages/atom-vllm/pyproject.toml", '"atom-core>=0.1,<0.2"', '"atom-core==0.1.0"')
    assert problems(root) == ["atom-vllm: bound on atom-core must be a range, not '==0.1.0'"]


def test_bound_that_excludes_the_sibling_is_named(root):
    _edit(root / "packages/atom-sglang/pyproject.toml", '"atom-core>=0.1,<0.2"', '"atom-core>=0.2,<0.3"')
    assert problems(root) == ["atom-sglang: bound atom-core<0.3,>=0.2 excludes atom-core's version 0.1.0"]


def test_runtime_engine_range_must_match_the_pin(root):
    _edit(root / "packages/atom-vllm/src/atom_vllm/__init__.py", '">=0.32.0,<0.33"', '">=0.32.0,<0.34"')
    [problem] = problems(root)
    assert problem.startswith("atom-vllm: runtime SUPPORTED_VLLM = '>=0.32.0,<0.34'")


def test_tag_must_match_version_and_a_dated_changelog(root):
    assert problems(root, tag="atom-core-v0.2.0") == ["tag atom-core-v0.2.0 but atom-core's version is 0.1.0"]
    assert "not dated" in problems(root, tag="atom-core-v0.1.0")[0]
    assert "not <dist>-v<version>" in problems(root, tag="atom-foo-v1.0.0")[0]
    prepare(packages(root)["atom-core"], datetime.date(2026, 11, 21))
    assert "## 0.1.0 — 2026-11-21" in (root / "packages/atom-core/CHANGELOG.md").read_text()
    assert problems(root, tag="atom-core-v0.1.0") == []


@pytest.mark.parametrize(
    ("part", "expected"), [("patch", "0.1.1"), ("minor", "0.2.0"), ("major", "1.0.0"), ("0.1.5", "0.1.5")]
)
def test_next_version(part, expected):
    assert next_version("0.1.0", part) == expected


def test_next_version_must_move_forward():
    with pytest.raises(ValueError, match="not after"):
        next_version("0.2.0", "0.1.9")


def test_bump_rewrites_one_package_and_reports_broken_sibling_bounds(root, capsys):
    assert release_main(["bump", "atom-core", "minor"], root=root) == 1  # adapters still say <0.2
    pkg = packages(root)["atom-core"]
    assert pkg.version == "0.2.0" and pkg.module_constant("__version__") == "0.2.0"
    changelog = pkg.changelog.read_text()
    assert changelog.index("## 0.2.0 — unreleased") < changelog.index("## 0.1.0")
    err = capsys.readouterr().err
    assert "atom-vllm: bound atom-core<0.2,>=0.1 excludes atom-core's version 0.2.0" in err
    assert packages(root)["atom-kernels"].version == "0.1.0"  # nothing else moved
