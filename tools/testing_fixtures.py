"""pytest fixtures shared by several packages' tests (registered by the root conftest.py)."""

import pytest


@pytest.fixture
def installed_as(tmp_path, monkeypatch):
    """Make importlib.metadata report another version of a distribution: a real dist-info, first on sys.path."""

    def fake(dist: str, version: str) -> None:
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(tmp_path))

    return fake
