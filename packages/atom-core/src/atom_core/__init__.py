"""ATOM core: models, loading, configs and the standalone engine.

The public API is this package's top-level names plus `atom_core.integration`, the module meant for
framework adapters (atom-vllm, atom-sglang). Everything else is internal and may change in a patch release.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
