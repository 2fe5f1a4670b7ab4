"""Installs one built wheel alone into a fresh venv and checks it works there.

  python -m tools.smoke_install <dist> <wheel-dir>

The venv gets `<dist>` by name with <wheel-dir> as an extra source (siblings resolve from it, engines
from PyPI), as `pip install atom-vllm` would. Checked there: the package imports at its version; the
siblings it pulled are the ones built here; entry points are registered; importing the entry-point
module does not import the engine or torch; atom-core's `atom --version` runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.workspace import packages

ENTRY_POINTS = {"atom-vllm": "vllm.general_plugins", "atom-sglang": "sglang.srt.plugins"}
PULLS = {
    "atom-kernels": [],
    "atom-core": ["atom-kernels"],
    "atom-vllm": ["atom-core", "atom-kernels"],
    "atom-sglang": ["atom-core", "atom-kernels"],
}

PROBE = r"""
import importlib, importlib.metadata as md, json, sys
dist, group = sys.argv[1], sys.argv[2]
module = importlib.import_module(dist.replace("-", "_"))
eps = [f"{e.name}={e.value}" for e in md.entry_points(group=group)] if group else []
for ep in md.entry_points(group=group, name="atom") if group else []:
    importlib.import_module(ep.module)
print(json.dumps({
    "version": module.__version__,
    "installed": {d.metadata["Name"]: d.version for d in md.distributions() if d.metadata["Name"].startswith("atom-")},
    "entry_points": eps,
    "heavy_modules": sorted(m for m in ("torch", "vllm", "sglang") if m in sys.modules) if group else [],
}))
"""


def smoke(dist: str, wheel_dir: Path) -> list[str]:
    uv = os.environ.get("UV") or shutil.which("uv") or "uv"
    versions = {name: pkg.version for name, pkg in packages().items()}
    with tempfile.TemporaryDirectory(prefix=f"smoke-{dist}-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        python = str(venv / "bin" / "python")
        install = [uv, "pip", "install", "-q", "--python", python, "--find-links", str(wheel_dir), dist]
        subprocess.run(install, check=True)
        group = ENTRY_POINTS.get(dist, "")
        probe = subprocess.run([python, "-c", PROBE, dist, group], capture_output=True, text=True)
        if probe.returncode != 0:
            return [f"{dist}: import failed in a clean venv:\n{probe.stderr}"]
        report = json.loads(probe.stdout)
        errors = []
        if report["version"] != versions[dist]:
            errors.append(f"{dist}: imports as {report['version']}, expected {versions[dist]}")
        for sibling in [dist, *PULLS[dist]]:
            if report["installed"].get(sibling) != versions[sibling]:
                errors.append(
                    f"{dist}: {sibling} is {report['installed'].get(sibling)}, not the built {versions[sibling]}"
                )
        if group and not any(ep.startswith("atom=") for ep in report["entry_points"]):
            errors.append(f"{dist}: no 'atom' entry point in {group}: {report['entry_points']}")
        if report["heavy_modules"]:
            errors.append(f"{dist}: importing the entry-point module imported {report['heavy_modules']}")
        if dist == "atom-core":
            out = subprocess.run([str(venv / "bin" / "atom"), "--version"], capture_output=True, text=True)
            if out.returncode != 0 or not out.stdout.startswith(f"atom-core {versions['atom-core']}"):
                errors.append(f"atom-core: `atom --version` failed: {out.stdout}{out.stderr}")
        if not errors:
            print(f"smoke ok: {dist} {report['version']} with {report['installed']} {report['entry_points']}")
        return errors


def main() -> int:
    dist, wheel_dir = sys.argv[1], Path(sys.argv[2]).resolve()
    errors = smoke(dist, wheel_dir)
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
