"""The surface framework adapters may use (enforced by import-linter; see the root pyproject).

Adapters reach ATOM's kernels only through here, so an adapter release depends on one atom-core range.
Importing this module is cheap (no torch): engine plugins import it from their entry-point modules, which
engines load in every process. Kernel entry points load on first use.
"""

from typing import TYPE_CHECKING

from atom_core import __version__
from atom_core.engine_plugin import EnginePlugin
from atom_core.engine_version import EngineVersionError, check_engine_version

if TYPE_CHECKING:
    from atom_core.ops import silu_and_mul

_LAZY = {"silu_and_mul": "atom_core.ops"}

__all__ = [
    "EnginePlugin",
    "EngineVersionError",
    "__version__",
    "check_engine_version",
    "silu_and_mul",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
