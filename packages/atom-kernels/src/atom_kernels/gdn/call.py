"""One gated-delta-net call's inputs, gathered once by each entry point and read by its checks and by
the torch reference (ref.py), so the reference sees exactly what the kernels were given."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True, slots=True)
class Snapshots:
    """States kept partway through sequences (an engine's prefix cache keeps the state at a block
    boundary inside a prefill chunk, so the chunk need not end there): the state after the first lens[s]
    tokens of sequence s of this call also goes to slot slots[s], a slot of its own (-1: none kept).
    slots [S] int; lens [S] int32, 1 <= lens[s] <= the sequence's length where slots[s] >= 0 (the
    kernels keep nothing for a length outside that range; the reference refuses it)."""

    slots: torch.Tensor
    lens: torch.Tensor


class Span(NamedTuple):
    """One sequence of a call, as host ints: its slot, first and end token, whether it continues the
    slot's state, and (slot, length) of the state kept partway through it, if any."""

    slot: int
    start: int
    end: int
    keep: bool
    snapshot: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class SequenceSlots:
    """Where each sequence's recurrent state lives. cu_seqlens [S+1]: the sequences' tokens back to back;
    state_indices [S]: each sequence's slot (-1: a padding sequence, nothing read or written);
    has_initial_state [S] bool or int8 (False / 0: start from zeros; None: every sequence continues its slot);
    step_state_indices [T] (speculative verify: the state after each token goes to that slot, -1
    nowhere, and a sequence's own slot is written only where named); snapshots: states also kept
    partway through sequences (not with step_state_indices, which keep every token's)."""

    cu_seqlens: torch.Tensor
    state_indices: torch.Tensor
    has_initial_state: torch.Tensor | None = None
    step_state_indices: torch.Tensor | None = None
    snapshots: Snapshots | None = None

    def __post_init__(self) -> None:
        seqs = self.state_indices.numel()
        if self.snapshots is None:
            return
        if self.step_state_indices is not None:
            raise ValueError(
                "snapshots and step_state_indices cannot be combined: a verify keeps every state"
            )
        if self.snapshots.slots.shape != (seqs,) or self.snapshots.lens.shape != (seqs,):
            raise ValueError(
                f"snapshot slots and lens must be [S] = [{seqs}], got "
                f"{tuple(self.snapshots.slots.shape)}, {tuple(self.snapshots.lens.shape)}"
            )

    def spans(self) -> Iterator[Span]:
        """Each sequence that has a slot and tokens, as host ints (for the references: one sync per
        value)."""
        for s in range(self.state_indices.numel()):
            slot = int(self.state_indices[s])
            start, end = int(self.cu_seqlens[s]), int(self.cu_seqlens[s + 1])
            if slot >= 0 and end > start:
                keep = self.has_initial_state is None or bool(self.has_initial_state[s])
                yield Span(slot, start, end, keep, self._snapshot(s, end - start))

    def _snapshot(self, s: int, length: int) -> tuple[int, int] | None:
        if self.snapshots is None or (slot := int(self.snapshots.slots[s])) < 0:
            return None
        n = int(self.snapshots.lens[s])
        if not 1 <= n <= length:
            raise ValueError(f"sequence {s} of {length} tokens cannot keep the state after {n} of them")
        return slot, n

    def step_slot(self, token: int) -> int:
        """The slot that keeps the state after `token` (-1: none, or no step slots)."""
        return -1 if self.step_state_indices is None else int(self.step_state_indices[token])


class Gating(NamedTuple):
    """What g and beta come from (gdn_gating's inputs): A_log, dt_bias [HV]; a, b [T, HV] (rows may be
    strided, last dim contiguous). A kernel given these computes g and beta per token itself, with
    gdn_gating's formulas and roundings, so the separate gating launch goes."""

    A_log: torch.Tensor
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor


@dataclass(frozen=True, slots=True)
class GdnCall:
    """A gated delta rule (layouts in ref.py): q, k [T, HK, Dk]; v [T, HV, Dv]; g (log decay), beta
    [T, HV] (None where the kernel computes them from Gating inputs); state [slots, HV, Dv, Dk] at
    `slots`; use_qk_l2norm: L2-normalize q and k first."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor | None
    beta: torch.Tensor | None
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
