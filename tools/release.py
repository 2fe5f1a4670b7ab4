"""Release helper for one package at a time.

  python -m tools.release prepare <dist>          date the current version's CHANGELOG entry (before tagging)
  python -m tools.release bump <dist> <part|X.Y.Z>  move to the next version (part: major, minor, patch)
                                                 and open its '## <version> — unreleased' CHANGELOG entry
Both rewrite only that package's files, then run the workspace checks and print what they find (a bump
of atom-core past a sibling's bound, say, is reported so that bound is widened in the same change).
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

from packaging.version import Version

from tools.check_versions import problems
from tools.workspace import REPO, Package, changelog_heading, packages


def next_version(current: str, part: str) -> str:
    if part not in ("major", "minor", "patch"):
        if Version(part) <= Version(current):
            raise ValueError(f"{part} is not after the current version {current}")
        return part
    major, minor, patch = Version(current).release[:3]
    return {
        "major": f"{major + 1}.0.0",
        "minor": f"{major}.{minor + 1}.0",
        "patch": f"{major}.{minor}.{patch + 1}",
    }[part]


def _replace_line(path: Path, pattern: str, line: str) -> None:
    text, n = re.subn(pattern, line, path.read_text(), count=1, flags=re.MULTILINE)
    if n != 1:
        raise ValueError(f"{path}: no line matching {pattern!r}")
    path.write_text(text)


def prepare(pkg: Package, today: datetime.date) -> None:
    heading = changelog_heading(pkg, pkg.version)
    if heading is None or "unreleased" not in heading.lower():
        raise ValueError(f"{pkg.name}: no '## {pkg.version} — unreleased' entry to date")
    _replace_line(
        pkg.changelog, rf"^## {re.escape(pkg.version)}\b.*$", f"## {pkg.version} — {today.isoformat()}"
    )


def bump(pkg: Package, part: str) -> str:
    old, new = pkg.version, next_version(pkg.version, part)
    _replace_line(pkg.dir / "pyproject.toml", rf'^version = "{re.escape(old)}"$', f'version = "{new}"')
    _replace_line(pkg.init_file, rf'^__version__ = "{re.escape(old)}"$', f'__version__ = "{new}"')
    text = pkg.changelog.read_text()
    first_entry = text.find("\n## ")
    entry = f"\n## {new} — unreleased\n"
    pkg.changelog.write_text(
        text + entry if first_entry < 0 else text[:first_entry] + entry + text[first_entry:]
    )
    return new


def main(argv: list[str] | None = None, root: Path = REPO) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare").add_argument("dist")
    bump_parser = sub.add_parser("bump")
    bump_parser.add_argument("dist")
    bump_parser.add_argument("part")
    args = parser.parse_args(argv)
    pkgs = packages(root)
    if args.dist not in pkgs:
        print(f"no package {args.dist!r}; packages: {', '.join(pkgs)}", file=sys.stderr)
        return 2
    pkg = pkgs[args.dist]
    if args.command == "prepare":
        prepare(pkg, datetime.date.today())
        print(f"{pkg.name} {pkg.version}: CHANGELOG dated; tag it {pkg.name}-v{pkg.version}")
    else:
        new = bump(pkg, args.part)
        print(f"{pkg.name}: {new}, CHANGELOG entry opened")
    found = problems(root)
    for line in found:
        print(f"to fix: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
