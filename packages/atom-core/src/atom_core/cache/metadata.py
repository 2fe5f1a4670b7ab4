"""Per-forward metadata of state caches (kind "state"): which slot each sequence's state lives in.

A speculative verify step runs the sequences that verify drafts first: for their tokens, `step_slots` says
where the state after each token is kept (the sequence's own slot for its last known token, a spare slot
for each draft), so the engine can commit the state of the last accepted position by renaming slots,
without a copy and without keeping a rejected draft's effect. The other sequences (prefills, decodes
without drafts) follow in `rest` with their own metadata.

With prefix caching, a prefill chunk that passes the block boundary whose state a later request can
resume from keeps the state there (`snapshots`: a slot and the chunk's tokens before it, per sequence),
so the chunk does not have to end at the boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from atom_core.host_copy import host_to_device, to_device
from atom_core.ops import ChunkPlan, Snapshots, plan_chunks


@dataclass(slots=True)
class StateMetadata:
    slots: torch.Tensor  # [B] int32: each sequence's row in every state cache (-1: padding, left alone)
    fresh: torch.Tensor  # [B] bool: the sequence starts in this forward (its state is zero, not the slot's)
    cu_seqlens_q: torch.Tensor  # [B+1] int32: each sequence's tokens in this forward, back to back
    max_query_len: int
    step_slots: torch.Tensor | None = None  # [T] int32: where the state after each token goes (verify)
    num_tokens: int = 0  # with step_slots: the tokens these sequences cover (rest's come after them)
    rest: StateMetadata | None = None  # with step_slots: the sequences after them, if any
    snapshots: Snapshots | None = None  # states kept partway through sequences' chunks
    # what every state layer of the forward derives alike, made by the first that needs it
    _started: torch.Tensor | None = None
    _chunk_plan: ChunkPlan | None = None

    def started(self) -> torch.Tensor:
        """[B] int8, 1 where the sequence continues its slot's state (not fresh): the dtype the GDN kernels
        read, made in one launch a forward, not converted again by each layer's two kernels."""
        if self._started is None:
            self._started = self.fresh.view(torch.int8) ^ 1
        return self._started

    def chunk_plan(self, num_tokens: int) -> ChunkPlan:
        """The chunked delta rule's plan of these sequences' num_tokens tokens (plan_chunks), the same
        for every GDN layer of the forward: the first one makes it (about twenty small launches)."""
        if self._chunk_plan is None:
            lens = None if self.snapshots is None else self.snapshots.lens
            self._chunk_plan = plan_chunks(self.cu_seqlens_q, num_tokens, lens)
        return self._chunk_plan

    def parts(self, num_tokens: int) -> list[tuple[int, int, StateMetadata]]:
        """(first token, end token, metadata) of each group of sequences run together: one group, or the
        verifying sequences with step slots, then the rest."""
        if self.step_slots is None:
            return [(0, num_tokens, self)]
        parts = [(0, self.num_tokens, self)]
        if self.rest is not None:
            parts.append((self.num_tokens, num_tokens, self.rest))
        return parts

    @classmethod
    def build(
        cls,
        *,
        slots: Sequence[int],
        fresh: Sequence[bool],
        query_lens: Sequence[int],
        step_slots: Sequence[int] = (),
        snapshot_slots: Sequence[int] = (),
        snapshot_lens: Sequence[int] = (),
        device: torch.device | str = "cpu",
    ) -> StateMetadata:
        """step_slots: per token of the leading sequences that verify drafts (their lengths sum to
        len(step_slots)); empty when no sequence verifies. snapshot_slots, snapshot_lens: per sequence,
        the slot that keeps the state after the first snapshot_lens[i] tokens of its chunk (-1: none;
        never a verifying sequence); empty when none does."""
        if not (len(slots) == len(fresh) == len(query_lens)):
            raise ValueError("slots, fresh and query_lens must have one entry per sequence")
        if snapshot_slots and not (len(snapshot_slots) == len(snapshot_lens) == len(slots)):
            raise ValueError("snapshot_slots and snapshot_lens must have one entry per sequence")
        if step_slots:
            covered, tokens = 0, 0
            while tokens < len(step_slots):
                tokens += query_lens[covered]
                covered += 1
            if tokens != len(step_slots):
                raise ValueError("step_slots must cover whole leading sequences")
            if any(s >= 0 for s in snapshot_slots[:covered]):
                raise ValueError("a sequence that verifies drafts keeps every token's state, not a snapshot")
            head = cls.build(
                slots=slots[:covered], fresh=fresh[:covered], query_lens=query_lens[:covered], device=device
            )
            head.step_slots = to_device(list(step_slots), torch.int32, device)
            head.num_tokens = tokens
            if covered < len(slots):
                head.rest = cls.build(
                    slots=slots[covered:],
                    fresh=fresh[covered:],
                    query_lens=query_lens[covered:],
                    snapshot_slots=snapshot_slots[covered:],
                    snapshot_lens=snapshot_lens[covered:],
                    device=device,
                )
            return head
        cu = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(list(query_lens)).cumsum(0)
        snapshots = None
        if any(s >= 0 for s in snapshot_slots):  # (one copy for both)
            kept = to_device([list(snapshot_slots), list(snapshot_lens)], torch.int32, device)
            snapshots = Snapshots(kept[0], kept[1])
        return cls(
            slots=to_device(list(slots), torch.int32, device),
            fresh=to_device(list(fresh), torch.bool, device),
            cu_seqlens_q=host_to_device(cu, device),
            max_query_len=max(query_lens),
            snapshots=snapshots,
        )
