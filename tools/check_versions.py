"""Checks versions and bounds across the workspace.

- each package's pyproject version equals its `__version__` and has a CHANGELOG heading `## <version>`;
- a bound on a sibling is a range (never ==) that admits the sibling's current version;
- an adapter's runtime engine range (SUPPORTED_VLLM / SUPPORTED_SGLANG) equals its dependency pin;
- with --tag <dist>-v<version>: the tag names a package at that version whose CHANGELOG entry is dated.
Exit 0 when all hold; otherwise every problem is printed, one a line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.workspace import REPO, changelog_heading, packages

ENGINE_CONSTANTS = {"atom-vllm": ("vllm", "SUPPORTED_VLLM"), "atom-sglang": ("sglang", "SUPPORTED_SGLANG")}


def problems(root: Path = REPO, tag: str | None = None) -> list[str]:
    pkgs = packages(root)
    found = []
    for pkg in pkgs.values():
        if (init_version := pkg.module_constant("__version__")) != pkg.version:
            found.append(f"{pkg.name}: pyproject version {pkg.version} but __version__ = {init_version}")
        if changelog_heading(pkg, pkg.version) is None:
            found.append(f"{pkg.name}: CHANGELOG.md has no '## {pkg.version}' entry")
        for req in pkg.requirements:
            if req.name in pkgs:
                sibling = pkgs[req.name]
                if any(spec.operator in ("==", "===") for spec in req.specifier):
                    found.append(f"{pkg.name}: bound on {req.name} must be a range, not '{req.specifier}'")
                if not req.specifier.contains(sibling.version, prereleases=True):
                    found.append(
                        f"{pkg.name}: bound {req.name}{req.specifier} excludes {req.name}'s version {sibling.version}"
                    )
        if pkg.name in ENGINE_CONSTANTS:
            engine, constant = ENGINE_CONSTANTS[pkg.name]
            pins = [str(r.specifier) for r in pkg.requirements if r.name == engine]
            runtime = pkg.module_constant(constant)
            if not pins or set(pins[0].split(",")) != set((runtime or "").split(",")):
                found.append(f"{pkg.name}: runtime {constant} = {runtime!r} but the dependency pin is {pins}")
    if tag is not None:
        found += tag_problems(pkgs, tag)
    return found


def tag_problems(pkgs, tag: str) -> list[str]:
    dist, sep, version = tag.rpartition("-v")
    if not sep or dist not in pkgs:
        return [f"tag {tag!r} is not <dist>-v<version> for a package here ({', '.join(pkgs)})"]
    pkg = pkgs[dist]
    if version != pkg.version:
        return [f"tag {tag} but {dist}'s version is {pkg.version}"]
    heading = changelog_heading(pkg, version)
    if heading is None or "unreleased" in heading.lower():
        return [f"{dist} {version}: CHANGELOG entry is not dated (run tools/release.py prepare {dist})"]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", help="a release tag to check, e.g. atom-core-v0.1.0")
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    found = problems(args.root, args.tag)
    for line in found:
        print(line, file=sys.stderr)
    if not found:
        print(f"versions ok: {', '.join(f'{n} {p.version}' for n, p in packages(args.root).items())}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
