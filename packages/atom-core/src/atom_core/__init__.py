"""ATOM core: models, loading, configs and the standalone engine.

The public API is this package's top-level names (the offline engine, as vLLM users write it:
`from atom_core import LLM, SamplingParams`) plus `atom_core.integration`, the module meant for framework
adapters (atom-vllm, atom-sglang). Everything else is internal and may change in a patch release.
Importing the package is cheap: the engine (and torch) load when one of its names is first used.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from atom_core.engine import (
        LLM,
        CompletionOutput,
        EngineConfig,
        LLMEngine,
        OutputKind,
        RequestOutput,
        SamplingParams,
    )

_ENGINE_NAMES = (
    "LLM",
    "EngineConfig",
    "LLMEngine",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "OutputKind",
)

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "OutputKind",
    "RequestOutput",
    "SamplingParams",
    "__version__",
]


def __getattr__(name: str):
    if name in _ENGINE_NAMES:
        import atom_core.engine

        return getattr(atom_core.engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
