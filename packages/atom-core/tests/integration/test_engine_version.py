from importlib import metadata

import pytest
from packaging.version import Version

from atom_core.integration import EngineVersionError, check_engine_version

# A real installed distribution stands in for the engine: the check reads real package metadata.
INSTALLED = Version(metadata.version("packaging"))


def _check(supported, distributions=("packaging",)):
    return check_engine_version(
        adapter="atom-test",
        engine="packaging",
        distributions=distributions,
        supported=supported,
        override_env="ATOM_TEST_SKIP_VERSION_CHECK",
    )


def test_inside_the_range_returns_the_version():
    assert _check(f">={INSTALLED},<{INSTALLED.major + 1}") == INSTALLED


def test_outside_the_range_names_installed_supported_and_the_fix(monkeypatch):
    monkeypatch.delenv("ATOM_TEST_SKIP_VERSION_CHECK", raising=False)
    with pytest.raises(EngineVersionError) as err:
        _check(">=0.1,<0.2")
    text = str(err.value)
    assert f"packaging=={INSTALLED} is installed" in text
    assert "supports packaging >=0.1,<0.2" in text
    assert "pip install 'packaging>=0.1,<0.2'" in text
    assert "ATOM_TEST_SKIP_VERSION_CHECK=1" in text


def test_override_lets_an_unsupported_version_through(monkeypatch):
    monkeypatch.setenv("ATOM_TEST_SKIP_VERSION_CHECK", "1")
    assert _check(">=0.1,<0.2") == INSTALLED


def test_first_installed_distribution_is_used():
    assert _check(f"=={INSTALLED}", distributions=("no-such-dist-xyz", "packaging")) == INSTALLED


def test_missing_engine_says_what_to_install():
    with pytest.raises(EngineVersionError, match="none of no-such-dist-xyz is installed"):
        _check(">=1", distributions=("no-such-dist-xyz",))
