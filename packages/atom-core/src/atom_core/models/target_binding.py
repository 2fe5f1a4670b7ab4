"""How a draft model shares its target's embedding and head: bound once by bind_target, never the draft's
own parameters (so loading and moving the draft leaves the target's alone).

The native engine binds the target model itself; an adapter binds what its engine shares (SharedVocab
from the target's modules or weights). Either has embed_input_ids and compute_logits.
"""

from __future__ import annotations

import torch
from torch import nn


class TargetBinding:
    """Mixed into an MTP draft: bind_target, the bound target, and the target's embedding and head."""

    _target: tuple[nn.Module, ...] = ()  # a tuple: the target stays out of the draft's submodules

    def bind_target(self, target: nn.Module) -> None:
        """Share target's embed_input_ids and compute_logits with this draft."""
        self._target = (target,)

    @property
    def target(self) -> nn.Module | None:
        """What bind_target bound, or None before it was called."""
        return self._target[0] if self._target else None

    def _bound(self) -> nn.Module:
        if not self._target:
            raise RuntimeError(
                f"{type(self).__name__} runs on its target's embedding and head: bind_target first"
            )
        return self._target[0]

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [T] -> [T, H] through the target's embedding."""
        return self._bound().embed_input_ids(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [T, H] -> [T, vocab] through the target's head."""
        return self._bound().compute_logits(hidden)
