"""The workspace's packages as data: name, version, dependencies, files (shared by the release tools)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Package:
    dir: Path

    @property
    def pyproject(self) -> dict:
        return tomllib.loads((self.dir / "pyproject.toml").read_text())

    @property
    def name(self) -> str:
        return self.pyproject["project"]["name"]

    @property
    def import_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def version(self) -> str:
        return self.pyproject["project"]["version"]

    @property
    def requirements(self) -> list[Requirement]:
        return [Requirement(r) for r in self.pyproject["project"].get("dependencies", [])]

    @property
    def init_file(self) -> Path:
        return self.dir / "src" / self.import_name / "__init__.py"

    @property
    def changelog(self) -> Path:
        return self.dir / "CHANGELOG.md"

    def module_constant(self, name: str) -> str | None:
        match = re.search(rf'^{name} = "([^"]*)"', self.init_file.read_text(), re.MULTILINE)
        return match.group(1) if match else None


def packages(root: Path = REPO) -> dict[str, Package]:
    found = (Package(p.parent) for p in sorted((root / "packages").glob("*/pyproject.toml")))
    return {pkg.name: pkg for pkg in found}


def changelog_heading(pkg: Package, version: str) -> str | None:
    """The text after '## <version>' in the package's CHANGELOG ('— unreleased', '— 2026-11-21'), or None."""
    match = re.search(rf"^## {re.escape(version)}\b(.*)$", pkg.changelog.read_text(), re.MULTILINE)
    return match.group(1).strip() if match else None
