"""The native engine: scheduler, paged KV with prefix caching, model runner, sampler, LLM API.

Importing the package is cheap (the CLI reads EngineConfig's options from it); the engine's names load
on first use.
"""

from typing import TYPE_CHECKING

from atom_core.engine.config import EngineConfig

if TYPE_CHECKING:
    from atom_core.engine.llm import LLM
    from atom_core.engine.llm_engine import LLMEngine
    from atom_core.engine.outputs import CompletionOutput, OutputKind, RequestOutput
    from atom_core.engine.sampling_params import SamplingParams
    from atom_core.engine.structured.params import StructuredOutputsParams

_LAZY = {
    "LLM": "atom_core.engine.llm",
    "LLMEngine": "atom_core.engine.llm_engine",
    "CompletionOutput": "atom_core.engine.outputs",
    "RequestOutput": "atom_core.engine.outputs",
    "OutputKind": "atom_core.engine.outputs",
    "SamplingParams": "atom_core.engine.sampling_params",
    "StructuredOutputsParams": "atom_core.engine.structured.params",
}

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "OutputKind",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
