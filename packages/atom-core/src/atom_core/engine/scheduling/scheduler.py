"""Continuous batching: every step serves running sequences first, then admits waiting ones, under a token budget.

Prefills are chunked to fit the budget (a long prompt spreads over several steps, mixed with decodes).
While requests wait to be admitted, running prefills together take at most half the budget: a long
prompt then cannot hold the whole budget until its prefill ends, and the request behind it starts within
a step (alone, a prefill still takes the whole budget).
When the KV cache runs out, the most recently arrived running sequence is preempted: its blocks are
freed and it is recomputed later from its prompt and the tokens it already produced (prefix caching
makes that cheap). Order is first come, first served.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from atom_core.engine.config import SchedulerConfig
from atom_core.engine.plan import CachePlan
from atom_core.engine.scheduling.block_manager import BlockManager
from atom_core.engine.scheduling.sequence import Sequence, Status
from atom_core.engine.state.state_slots import StateSlots
from atom_core.engine.state.state_snapshots import StateSnapshots


class StateSave(NamedTuple):
    """The state of seq after the block at block_index (a cacheable boundary), kept in snapshot slot
    `slot`: the state after the first `upto` tokens of seq's chunk in this step. The forward keeps it
    where it passes the boundary (within the chunk or at its end), so no chunk has to end there."""

    seq: Sequence
    block_index: int
    slot: int
    upto: int


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens each sequence computes this step (its drafts included)
    drafts: list[list[int]] = field(default_factory=list)  # speculative tokens verified after its known ones
    # state layers with prefix caching: (sequence, snapshot slot) to start from before the forward, and
    # the states the forward keeps at block boundaries
    restores: list[tuple[Sequence, int]] = field(default_factory=list)
    saves: list[StateSave] = field(default_factory=list)


class Scheduler:
    """Owns the KV blocks (and, for models with state layers, the state slots and snapshots) the plan
    sizes: a running sequence holds plan.state_slots_per_seq slots (its own, and one spare per draft under
    speculation: a verify step keeps the state after each of its tokens)."""

    def __init__(self, config: SchedulerConfig, plan: CachePlan):
        self.config = config
        snapshots = StateSnapshots(plan.snapshot_range) if plan.has_state and plan.snapshot_slots else None
        self.blocks = BlockManager(
            plan.num_blocks, plan.block_size, prefix_caching=plan.prefix_caching, snapshots=snapshots
        )
        self.state_slots = StateSlots(plan.num_running_slots) if plan.has_state else None
        self.spare_state_slots = max(plan.state_slots_per_seq - 1, 0)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_chunked_prefills = 0  # steps that computed only part of a sequence's known tokens
        self.num_state_restores = 0  # admissions that resumed a state snapshot (prefix hits of state models)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        # what running prefills may take: half the budget while a request waits that a free sequence slot
        # could admit (at least one token: a budget of one still advances them)
        admissible = self.waiting and len(self.running) < self.config.max_num_seqs
        prefill_budget = max(1, budget // 2) if admissible else budget
        batch = ScheduledBatch([], [])
        # a prefill leaves a token for each decode behind it, and its drafts too when all of them fit:
        # decodes never wait for a long prompt (under async scheduling every pending token is computed the
        # step after it was sampled, and a verify launched ahead keeps its shape beside prefills)
        decoding = [s for s in self.running if s.status is Status.RUNNING and s.num_uncomputed == 1]
        with_drafts = sum(1 + len(s.draft_token_ids) for s in decoding) <= budget
        decodes = sum(1 + len(s.draft_token_ids) * with_drafts for s in decoding)
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget == 0:
                continue
            prefilling = seq.num_uncomputed > 1
            decodes -= 0 if prefilling else 1 + len(seq.draft_token_ids) * with_drafts
            if prefilling and min(prefill_budget, budget - decodes) <= 0:
                continue
            # drafts ride behind a decoding sequence's last token, as many as the budget leaves room for
            drafts = seq.draft_token_ids[: budget - 1] if seq.num_uncomputed == 1 else []
            cap = min(prefill_budget, budget - decodes) if prefilling else budget
            n = min(seq.num_uncomputed + len(drafts), cap)
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
            self._plan_snapshot(seq, n, batch)
            budget -= n
            prefill_budget -= n if prefilling else 0
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
                if seq.restore_slot >= 0:
                    batch.restores.append((seq, seq.restore_slot))
                    self.num_state_restores += 1
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            batch.drafts.append([])
            self._plan_snapshot(seq, n, batch)
            budget -= n
        return self._verifying_first(batch)

    def _plan_snapshot(self, seq: Sequence, n: int, batch: ScheduledBatch) -> None:
        """Keep the state where this chunk passes a cacheable block boundary: at the last one (what a
        request with the same prompt hits), within the chunk or at its end, even by evicting the least
        recently used snapshot; else at the chunk's end if it is a boundary on the way (a shorter shared
        prefix), only in a free slot."""
        snapshots, b = self.blocks.snapshots, self.blocks.block_size
        if snapshots is None:
            return
        start, target = seq.num_computed_tokens, self.blocks.cacheable_blocks(seq) * b
        end = target if start < target <= start + n else start + n
        if end % b or end > target:
            return
        slot = snapshots.reserve(evict=end == target)
        if slot is not None:
            batch.saves.append(StateSave(seq, end // b - 1, slot, end - start))

    def grant_draft_rows(self, seq: Sequence, n: int) -> bool:
        """Blocks for n rows past seq's computed tokens (a chained draft's cache rows), if free ones are
        left: drafts never preempt a sequence."""
        if not self.blocks.can_allocate(seq, n):
            return False
        self.blocks.allocate(seq, n)
        return True

    def settle_snapshots(self, batch: ScheduledBatch, *, ran: bool) -> None:
        """After the batch's forward (ran) or its failure: the states it saved are findable by their
        block's content key (registered now), the slots of those that could not be are given back."""
        for seq, index, slot, _ in batch.saves:
            if ran:
                self.blocks.register_full_blocks(seq)
            if ran and index < len(seq.block_keys):
                self.blocks.snapshots.commit(seq.block_keys[index], slot)
            else:
                self.blocks.snapshots.release(slot)

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
            batch.restores,
            batch.saves,
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
