"""Continuous batching: every step serves running sequences first, then admits waiting ones, under a token budget.

Prefills are chunked to fit the budget (a long prompt spreads over several steps, mixed with decodes).
When the KV cache runs out, the most recently arrived running sequence is preempted: its blocks are
freed and it is recomputed later from its prompt and the tokens it already produced (prefix caching
makes that cheap). Order is first come, first served.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from atom_core.engine.block_manager import BlockManager
from atom_core.engine.sequence import Sequence, Status
from atom_core.engine.state_slots import StateSlots


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192

    def __post_init__(self):
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be at least 1")


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens each sequence computes this step (its drafts included)
    drafts: list[list[int]] = field(default_factory=list)  # speculative tokens verified after its known ones


class Scheduler:
    """state_slots: for models with state layers: a running sequence holds one, and spare_state_slots more
    under speculation (one per draft: a verify step keeps the state after each of its tokens)."""

    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockManager,
        state_slots: StateSlots | None = None,
        *,
        spare_state_slots: int = 0,
    ):
        per_seq = 1 + spare_state_slots
        if state_slots is not None and state_slots.num_slots < config.max_num_seqs * per_seq:
            raise ValueError(
                f"{state_slots.num_slots} state slots cannot hold max_num_seqs {config.max_num_seqs} "
                f"sequences of {per_seq}"
            )
        self.config = config
        self.spare_state_slots = spare_state_slots
        self.blocks = blocks
        self.state_slots = state_slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_chunked_prefills = 0  # steps that computed only part of a sequence's known tokens

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        batch = ScheduledBatch([], [])
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget == 0:
                continue
            # drafts ride behind a decoding sequence's last token, as many as the budget leaves room for
            drafts = seq.draft_token_ids[: budget - 1] if seq.num_uncomputed == 1 else []
            n = min(seq.num_uncomputed + len(drafts), budget)
            if drafts and not self.blocks.can_allocate(seq, n):  # short of blocks: drafts go before others do
                drafts, n = [], seq.num_uncomputed
            while not self.blocks.can_allocate(seq, n):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            self.blocks.allocate(seq, n)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            batch.drafts.append(drafts)
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            self.blocks.admit(seq)
            n = min(seq.num_uncomputed, budget)
            if not self.blocks.can_allocate(seq, n):
                self.blocks.release(seq)  # hand back the cached prefix; retry next step
                if not self.running:
                    raise RuntimeError(
                        f"the KV cache cannot hold even one sequence of {len(seq.token_ids)} tokens "
                        f"({self.blocks.num_free_blocks} blocks of {self.blocks.block_size} free)"
                    )
                break
            self.waiting.popleft()
            self.num_chunked_prefills += n < seq.num_uncomputed
            self.blocks.allocate(seq, n)
            seq.status = Status.RUNNING
            if self.state_slots is not None:
                seq.state_slot = self.state_slots.take()
                seq.spare_state_slots = [self.state_slots.take() for _ in range(self.spare_state_slots)]
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            batch.drafts.append([])
            budget -= n
        return self._verifying_first(batch)

    @staticmethod
    def _verifying_first(batch: ScheduledBatch) -> ScheduledBatch:
        """Sequences that verify drafts lead the batch (state layers run them as one group), in order."""
        if not any(batch.drafts):
            return batch
        order = sorted(range(len(batch.seqs)), key=lambda i: not batch.drafts[i])
        return ScheduledBatch(
            [batch.seqs[i] for i in order],
            [batch.num_new_tokens[i] for i in order],
            [batch.drafts[i] for i in order],
        )

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        seq.draft_token_ids = []  # their draft KV went with the blocks
        if seq.state_slot >= 0:
            for slot in (seq.state_slot, *seq.spare_state_slots):
                self.state_slots.give_back(slot)
            seq.state_slot, seq.spare_state_slots = -1, []
