import logging
from importlib import metadata

import pytest
from packaging.version import Version

from atom_core.integration import EnginePlugin

# A real installed distribution stands in for the engine: the guard reads real package metadata.
INSTALLED = Version(metadata.version("packaging"))


@pytest.fixture
def activations():
    return []


@pytest.fixture
def plugin(activations, monkeypatch, caplog):
    for var in ("ATOM_TEST_DISABLE", "ATOM_TEST_SKIP_VERSION_CHECK"):
        monkeypatch.delenv(var, raising=False)
    caplog.set_level(logging.INFO, logger="atom-test")

    def make(supported: str) -> EnginePlugin:
        return EnginePlugin(
            adapter="atom-test",
            adapter_version="9.9.9",
            engine="packaging",
            distributions=("packaging",),
            supported=supported,
            disable_env="ATOM_TEST_DISABLE",
            override_env="ATOM_TEST_SKIP_VERSION_CHECK",
            logger=logging.getLogger("atom-test"),
            activate=activations.append,
        )

    return make


def test_activates_once_on_a_supported_engine(plugin, activations, caplog):
    p = plugin(f"=={INSTALLED}")
    assert p.register() is True
    assert p.register() is True
    assert activations == [INSTALLED]
    [line] = [r.getMessage() for r in caplog.records if "ATOM plugin active" in r.getMessage()]
    assert (
        line.startswith("ATOM plugin active: atom-test 9.9.9 (atom-core ")
        and f"on packaging {INSTALLED}" in line
    )


def test_reset_lets_a_new_process_decide_again(plugin, activations):
    p = plugin(f"=={INSTALLED}")
    p.register()
    p.reset()
    p.register()
    assert activations == [INSTALLED, INSTALLED]


def test_off_switch_wins_and_says_so(plugin, activations, caplog, monkeypatch):
    monkeypatch.setenv("ATOM_TEST_DISABLE", "1")
    assert plugin(f"=={INSTALLED}").register() is False
    assert activations == []
    assert "atom-test 9.9.9 disabled by ATOM_TEST_DISABLE=1; packaging runs unchanged" in caplog.text


def test_unsupported_engine_is_an_error_and_nothing_activates(plugin, activations, caplog):
    assert plugin("<0.1").register() is False
    assert activations == []
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert error.startswith("ATOM plugin NOT active: atom-test 9.9.9 supports packaging <0.1")
    assert f"packaging=={INSTALLED} is installed" in error


def test_override_activates_an_unsupported_engine(plugin, activations, monkeypatch):
    monkeypatch.setenv("ATOM_TEST_SKIP_VERSION_CHECK", "1")
    assert plugin("<0.1").register() is True
    assert activations == [INSTALLED]
