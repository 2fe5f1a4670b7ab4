"""How an engine's model class holds an atom-core model and loads its weights, the same in every adapter.

The engine's wrapper (or draft) keeps the atom-core model as its attribute `atom`, so the engine sees the
model's parameters as "atom.<atom-core name>"; loading ends with atom-core's finish_loading (weights
repacked for the kernels, tied heads bound) and reports what it filled in those names.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from atom_core.loader import finish_loading

ATOM_PREFIX = "atom"  # the attribute an engine's model class keeps the atom-core model in


def atom_module_prefix(prefix: str) -> str:
    """The module path of the atom-core model inside an engine's model class at `prefix` ("" at the root)."""
    return f"{prefix}.{ATOM_PREFIX}" if prefix else ATOM_PREFIX


def load_atom_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Checkpoint (name, tensor) pairs into `model` (an atom-core model or draft), then finish loading;
    returns the filled parameters' names as the engine sees them ("atom.<name>")."""
    filled = model.load_weights(weights)
    finish_loading(model)
    return {f"{ATOM_PREFIX}.{name}" for name in filled}
