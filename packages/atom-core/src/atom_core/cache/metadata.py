"""Per-forward metadata of state caches (kind "state"): which slot each sequence's state lives in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class StateMetadata:
    slots: torch.Tensor  # [B] int32: each sequence's row in every state cache (-1: padding, left alone)
    fresh: torch.Tensor  # [B] bool: the sequence starts in this forward (its state is zero, not the slot's)
    cu_seqlens_q: torch.Tensor  # [B+1] int32: each sequence's tokens in this forward, back to back
    max_query_len: int

    @classmethod
    def build(
        cls,
        *,
        slots: Sequence[int],
        fresh: Sequence[bool],
        query_lens: Sequence[int],
        device: torch.device | str = "cpu",
    ) -> StateMetadata:
        if not (len(slots) == len(fresh) == len(query_lens)):
            raise ValueError("slots, fresh and query_lens must have one entry per sequence")
        cu = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(list(query_lens)).cumsum(0)
        return cls(
            slots=torch.tensor(list(slots), dtype=torch.int32, device=device),
            fresh=torch.tensor(list(fresh), dtype=torch.bool, device=device),
            cu_seqlens_q=cu.to(device),
            max_query_len=max(query_lens),
        )
