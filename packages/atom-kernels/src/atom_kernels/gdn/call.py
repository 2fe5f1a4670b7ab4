"""One gated-delta-net call's inputs, gathered once by each entry point and read by its checks and by
the torch reference (ref.py), so the reference sees exactly what the kernels were given."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SequenceSlots:
    """Where each sequence's recurrent state lives. cu_seqlens [S+1]: the sequences' tokens back to back;
    state_indices [S]: each sequence's slot (-1: a padding sequence, nothing read or written);
    has_initial_state [S] bool (False: start from zeros; None: every sequence continues its slot);
    step_state_indices [T] (speculative verify: the state after each token goes to that slot, -1
    nowhere, and a sequence's own slot is written only where named)."""

    cu_seqlens: torch.Tensor
    state_indices: torch.Tensor
    has_initial_state: torch.Tensor | None = None
    step_state_indices: torch.Tensor | None = None

    def spans(self) -> Iterator[tuple[int, int, int, bool]]:
        """(slot, first token, end token, continues the slot's state) of each sequence that has a slot
        and tokens, as host ints (for the references: one sync per value)."""
        for s in range(self.state_indices.numel()):
            slot = int(self.state_indices[s])
            start, end = int(self.cu_seqlens[s]), int(self.cu_seqlens[s + 1])
            if slot >= 0 and end > start:
                keep = self.has_initial_state is None or bool(self.has_initial_state[s])
                yield slot, start, end, keep

    def step_slot(self, token: int) -> int:
        """The slot that keeps the state after `token` (-1: none, or no step slots)."""
        return -1 if self.step_state_indices is None else int(self.step_state_indices[token])


@dataclass(frozen=True, slots=True)
class GdnCall:
    """A gated delta rule (layouts in ref.py): q, k [T, HK, Dk]; v [T, HV, Dv]; g (log decay), beta
    [T, HV]; state [slots, HV, Dv, Dk] at `slots`; use_qk_l2norm: L2-normalize q and k first."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    state: torch.Tensor
    slots: SequenceSlots
    use_qk_l2norm: bool = True


@dataclass(frozen=True, slots=True)
class ConvCall:
    """A depthwise causal conv: x [T, D]; weight [D, W]; bias [D] or None; conv_state [slots, D, W-1],
    each slot's last W-1 inputs, at `slots`; activation: SiLU after the conv."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    conv_state: torch.Tensor
    slots: SequenceSlots
    activation: bool = True
