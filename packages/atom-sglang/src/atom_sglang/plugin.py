"""SGLang's general-plugin hook: SGLang calls `register()` in every process it starts.

Active, it registers the attention backend "atom" (registration.py); ATOM's models come from the
external model package atom_sglang.models, which asks the same gate.

Environment:
  ATOM_DISABLE_SGLANG_PLUGIN=1       leave SGLang untouched
  ATOM_SGLANG_SKIP_VERSION_CHECK=1   register even on an SGLang outside SUPPORTED_SGLANG (untested)
"""

from __future__ import annotations

import logging

from atom_core.integration import EnginePlugin
from atom_sglang import SUPPORTED_SGLANG, __version__


def _activate(engine_version) -> None:
    from atom_sglang.registration import register_attention_backend

    register_attention_backend()


PLUGIN = EnginePlugin(
    adapter="atom-sglang",
    adapter_version=__version__,
    engine="sglang",
    distributions=("sglang",),
    supported=SUPPORTED_SGLANG,
    disable_env="ATOM_DISABLE_SGLANG_PLUGIN",
    override_env="ATOM_SGLANG_SKIP_VERSION_CHECK",
    logger=logging.getLogger("atom_sglang"),  # SGLang configures the root logger, so this line shows
    activate=_activate,
)


def register() -> bool:
    """The `sglang.srt.plugins` entry point. Idempotent; returns whether ATOM is active."""
    return PLUGIN.register()
