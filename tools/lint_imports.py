"""Checks the layering contracts (import-linter, configured in the root pyproject.toml).

Every package's src/ goes on PYTHONPATH, so the adapters are analysed without vLLM or SGLang installed.
Usage: uv run python tools/lint_imports.py [--root DIR]   (exit 0: all contracts kept)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def lint_imports(root: Path = REPO) -> subprocess.CompletedProcess:
    srcs = [str(p) for p in sorted((root / "packages").glob("*/src"))]
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(srcs)}
    return subprocess.run([exe, "--no-cache"], cwd=root, env=env, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO)
    proc = lint_imports(parser.parse_args().root)
    print(proc.stdout[proc.stdout.find("Contracts") :] if "Contracts" in proc.stdout else proc.stdout, end="")
    print(proc.stderr, end="", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
