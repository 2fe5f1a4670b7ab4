"""Async scheduling under speculation: verify step N + 1 is launched before the host has read step N.

Without it the host reads each verify's draws, accepts drafts and emits tokens, then schedules and
prepares the next verify, while the device waits. Here, as async scheduling does for plain decoding, the
host works one step behind the device. It schedules verify N + 1 assuming every draft of N is accepted:
each sequence then has k + 1 tokens pending (N's row tokens, counted as known until read) and k draft
placeholders (N's proposals), so N + 1 has the same shape whatever N accepts, its KV blocks are the most
N could need, and its sampling keys are computed for every acceptance N could have. On the device, N
counted its accepted drafts; N + 1's rows move back by N's rejected drafts and take their tokens from N
(the bonus draw, then the drafts chained after it), and draw with the keys of their true output
positions (engine/execution/ahead_rows.py). N + 1's catch-up and chained draft forwards follow it at once.
Models with state layers start N + 1 from the state slot of N's last accepted token, which the device
picks. Then the host reads N: each sequence's accepted drafts and the tokens it emits (the draws up to
its first rejected draft), corrects its computed tokens by the drafts it rejected, commits the accepted
state slot as the device did, and emits. A sequence that stops
at N has N + 1 computed and dropped.

A step launches ahead when every sequence verifies k drafts or computes known tokens (a prefill chunk),
none has penalties (the draws are all on the device; an oracle forcing the drafts must force them on
the device too: Drafter.ahead_oracle), the free KV blocks hold N + 1's rows and chain for every running
sequence, and its rows stay within max_model_len. Requests that arrive are admitted beside it: their
chunks run in a forward of their own, launched first, whose final chunks' tokens are drawn on the device
and read with N + 1; their draft rows and chains follow N + 1's (speculation/prefill_drafts.py), and the
next verify takes them with no rows to move back (plan.prefills_ahead: one process, no state snapshots
kept around a chunk). Anything else reads the step in flight first (settle) and runs as a synchronous
verify, whose drafts the chain left on the device for it.
"""

from __future__ import annotations

import torch

from atom_core.engine.execution.runner import Runner, StepResult
from atom_core.engine.execution.step_inputs import StepInputs, prepare_step
from atom_core.engine.plan import CachePlan
from atom_core.engine.sampling.sampler import NON_FINITE, SAMPLING_FAILED, SamplingRows, draw_key
from atom_core.engine.scheduling.scheduler import ScheduledBatch, Scheduler
from atom_core.engine.scheduling.sequence import Sequence, Status
from atom_core.engine.speculation.drafting import Drafter
from atom_core.engine.speculation.prefill_drafts import PrefillPart
from atom_core.engine.steps.async_step import sampled_on_device
from atom_core.engine.steps.emit import Produced
from atom_core.engine.steps.in_flight_verify import InFlightVerify
from atom_core.engine.steps.stats import StepStats


class SpeculativeAhead:
    """The engine's one verify in flight, and the rules for launching the next one before reading it
    (the AsyncSteps interface, steps/async_step.py)."""

    def __init__(self, scheduler: Scheduler, drafter: Drafter, stats: StepStats, plan: CachePlan):
        self.scheduler, self.drafter, self.stats = scheduler, drafter, stats
        self.k, self.max_model_len = plan.num_speculative_tokens, plan.max_model_len
        self.in_flight: InFlightVerify | None = None
        self.enabled = True
        self.prefills = plan.prefills_ahead
        self.prefill: PrefillPart | None = None  # this step's prefill forward, launched before its verify

    @property
    def behind(self) -> StepResult | None:
        """The verify in flight, whose acceptance the next one's rows follow."""
        return None if self.in_flight is None else self.in_flight.result

    def _fits(self, seq: Sequence) -> bool:
        """seq's next verify and chain stay within max_model_len, and it drafts on the device."""
        return (
            seq.status is Status.RUNNING
            and sampled_on_device(seq.params)
            and seq.num_computed_tokens + 2 * self.k <= self.max_model_len
        )

    def _chain_blocks(self, seqs: list[Sequence], rows: int) -> bool:
        """The free KV blocks hold `rows` more rows past each sequence's computed tokens."""
        blocks = self.scheduler.blocks
        return sum(blocks.blocks_needed(seq, rows) for seq in seqs) <= blocks.num_free_blocks

    def continues(self) -> bool:
        """Whether the next verify can launch before the one in flight is read: every running sequence
        verifies k drafts again or prefills (with prefills_ahead; requests waiting to join too), none
        needs penalties or the host's tokens, and the free blocks hold each verify and chain and each
        prefill's rest (no preemption, no dropped draft)."""
        scheduler, blocks = self.scheduler, self.scheduler.blocks
        running = scheduler.running
        admits = bool(scheduler.waiting) and len(running) < scheduler.config.max_num_seqs
        # (a sequence with nothing on the device and no drafts computes known tokens: a prefill chunk)
        prefilling = [seq for seq in running if not seq.num_pending and not seq.draft_token_ids]
        if (admits or prefilling) and not self._prefills_beside():
            return False
        return (
            self.verifiers_continue()
            and all(self._prefill_fits(seq) for seq in prefilling)
            and (not admits or all(sampled_on_device(seq.params) for seq in scheduler.waiting))
            and sum(blocks.blocks_needed(seq, self.k * 2) for seq in self._verifying())
            + sum(blocks.blocks_needed(seq, seq.num_uncomputed) for seq in prefilling)
            <= blocks.num_free_blocks
        )

    def _verifying(self) -> list[Sequence]:
        return [seq for seq in self.scheduler.running if seq.num_pending or seq.draft_token_ids]

    def verifiers_continue(self) -> bool:
        """The verifying sequences' part of continues(): each follows the step in flight (its tokens there
        pending) with k drafts again, and all of them fit the token budget and their verify and chain
        the free blocks."""
        verifying, q = self._verifying(), self.k + 1
        return (
            self.enabled
            and self.drafter.forced_on_device
            and bool(verifying)
            and len(verifying) * q <= self.scheduler.config.max_num_batched_tokens
            and all(
                self._fits(seq)
                and seq.num_pending
                and seq.num_uncomputed == 1
                and len(seq.draft_token_ids) == self.k
                for seq in verifying
            )
            and self._chain_blocks(verifying, q + self.k - 1)
        )

    def _prefills_beside(self) -> bool:
        """Prefill chunks may run beside a verify launched ahead: the plan allows it, and no state
        snapshot is kept or restored around a chunk (the host copies those around the forward)."""
        return self.prefills and self.scheduler.blocks.snapshots is None

    @staticmethod
    def _prefill_fits(seq: Sequence) -> bool:
        """seq computes known tokens only, and its draw is on the device."""
        return seq.status is Status.RUNNING and seq.num_pending == 0 and sampled_on_device(seq.params)

    def launches_ahead(self, batch: ScheduledBatch) -> bool:
        """Whether this batch is a verify that can run ahead of the host: every sequence verifies k
        drafts after its one known token, and the free blocks hold its chain."""
        q = self.k + 1
        verifying = [seq for seq, draft in zip(batch.seqs, batch.drafts, strict=True) if draft]
        prefills = len(verifying) < len(batch.seqs)
        return (
            self.enabled
            and self.drafter.forced_on_device
            and bool(verifying)
            and not batch.restores
            and not batch.saves
            and (not prefills or self._prefills_beside())
            and all(
                (n == q and len(draft) == self.k and self._fits(seq)) if draft else self._prefill_fits(seq)
                for seq, n, draft in zip(batch.seqs, batch.num_new_tokens, batch.drafts, strict=True)
            )
            and self._chain_blocks(verifying, q + self.k - 1)
        )

    def split(self, batch: ScheduledBatch) -> tuple[ScheduledBatch, ScheduledBatch | None]:
        """A batch launching ahead: its verify (the sequences verifying drafts lead it) and its prefill
        chunks (None when it has none)."""
        n = sum(bool(draft) for draft in batch.drafts)
        if n == len(batch.seqs):
            return batch, None

        def part(rows: slice) -> ScheduledBatch:
            return ScheduledBatch(batch.seqs[rows], batch.num_new_tokens[rows], batch.drafts[rows])

        return part(slice(0, n)), part(slice(n, None))

    def run_prefills(self, batch: ScheduledBatch, runner: Runner) -> None:
        """The prefill chunks beside a verify launched ahead, before it: their forward, each final chunk's
        token drawn on the device (read with the verify). A failure here fails the batch as one forward."""
        inputs = prepare_step(batch)
        drawn = [batch.seqs[row] for row in inputs.ends]
        inputs.sampling = SamplingRows.of(drawn, [len(seq.output_token_ids) for seq in drawn])
        self.prefill = PrefillPart(batch, inputs, runner.run(inputs))

    def forget_prefills(self) -> None:
        """The batch failed: its prefills count as never run."""
        self.prefill = None

    def prepare(self, batch: ScheduledBatch, inputs: StepInputs) -> torch.Tensor | None:
        """Set the step's sampling (every row on the device, with keys for each lag its sequence may
        have), its acceptance count, and what its rows take from the device; returns the tokens fed."""
        k, q = self.k, self.k + 1
        inputs.verify_ahead = k
        seqs = [seq for seq in batch.seqs for _ in range(q)]
        # each row's output position as if the step in flight accepted every draft
        positions = [len(s.output_token_ids) + s.num_pending + j for s in batch.seqs for j in range(q)]
        inputs.sampling = rows = SamplingRows.of(seqs, positions)
        if self.in_flight is None:  # nothing to follow: the drafts fed from the chain before it
            return self.drafter.feed(batch, inputs)
        behind = self.in_flight.seqs + self.in_flight.drawn  # (the pending tokens' order)
        # each row's keys at its assumed position and the k before it: row j with lag l draws at j - l
        for i, seq in enumerate(batch.seqs):
            first = positions[i * q]
            earlier = [0] * k if seq.params.greedy else [draw_key(seq, first - k + m) for m in range(k)]
            window = earlier + rows.keys[i * q : i * q + q]  # the keys of first - k .. first + k
            rows.lagged_keys += [window[j + k :: -1][:q] for j in range(q)]
        row_of = {id(seq): row for row, seq in enumerate(behind)}
        for i, seq in enumerate(batch.seqs):
            r = row_of[id(seq)]
            inputs.shift_from.append(r)
            inputs.fed_rows += range(i * q, i * q + q)
            inputs.fed_from += range(r * q, r * q + q)
        inputs.fed_source = "ahead"
        return self.drafter.pending.tokens

    def launch(self, batch: ScheduledBatch, inputs: StepInputs, result: StepResult) -> list[Produced]:
        """After the verify and its draft forwards were launched (Drafter.launch_ahead): its tokens' copy
        to the host; then, as if it accepted every draft, its sequences' computed and pending tokens;
        then the step before it is read (the device runs this one meanwhile)."""
        q = self.k + 1
        for seq in batch.seqs:
            seq.num_computed_tokens += q
            seq.num_pending += q
        part, self.prefill = self.prefill, None
        if part is not None:
            for seq, n in zip(part.batch.seqs, part.batch.num_new_tokens, strict=True):
                seq.num_computed_tokens += n
                self.scheduler.blocks.register_full_blocks(seq)
            for seq in part.drawn:
                seq.num_pending += 1
            # the next verify's rows of the prefilled sequences follow no acceptance: no lag
            result.rejected = torch.cat([result.rejected, result.rejected.new_zeros(len(part.drawn))])
        launched = InFlightVerify.launch(batch.seqs, result, inputs.sampling, part)
        previous, self.in_flight = self.in_flight, launched
        if previous is None:
            return []
        self.stats.num_async_steps += 1
        return self._read(previous)

    def sample_masked(self) -> None:
        """(Every verify draws in its forward: structured outputs are refused under speculation.)"""

    def drop(self) -> None:
        self.in_flight = None

    def forget_if_unread(self) -> None:
        """A verify in flight whose sequences all ended is dropped: nobody reads it."""
        step = self.in_flight
        if step is not None and not any(s.status is Status.RUNNING for s in step.seqs + step.drawn):
            self.drop()

    def settle(self) -> list[Produced]:
        """Read the verify in flight and take it off (its chain's drafts stay pending for the next step)."""
        step, self.in_flight = self.in_flight, None
        return self._read(step)

    def _read(self, step: InFlightVerify) -> list[Produced]:
        """A verify's tokens: per sequence still running, the draws up to its first rejected draft; its
        computed tokens drop by the drafts it rejected (their KV rows are written again)."""
        k, q = self.k, self.k + 1
        values = step.read.tolist()
        n, s = len(step.seqs) * q, len(step.seqs)
        tokens, status, accepted = values[:n], values[n : 2 * n], values[2 * n : 2 * n + s]
        found = {} if step.logprobs is None else step.logprobs.dicts(tokens, step.top)
        produced = []
        for i, seq in enumerate(step.seqs):
            if seq.status is not Status.RUNNING:
                continue
            a, rows = accepted[i], range(i * q, i * q + q)
            # the drafts a synchronous verify would have verified here (none past max_tokens or
            # max_model_len): the counters count those
            drafted = min(
                k, seq.params.max_tokens - len(seq.output_token_ids), self.max_model_len - len(seq.token_ids)
            )
            seq.num_pending -= q
            seq.num_computed_tokens -= k - a
            if seq.state_slot >= 0:  # (the verify after it started from this slot on the device)
                seq.commit_state(a)
            if any(status[r] == 0 for r in rows):
                produced.append(Produced(seq, error=NON_FINITE))
                continue
            if any(status[r] != 1 for r in rows[: a + 1]):
                produced.append(Produced(seq, error=SAMPLING_FAILED))
                continue
            counted = min(a, max(drafted, 0))
            seq.num_drafted += max(drafted, 0)
            seq.num_accepted += counted
            self.stats.num_draft_tokens += max(drafted, 0)
            self.stats.num_accepted_tokens += counted
            self.stats.num_verifications += drafted > 0
            emitted = rows[: a + 1]
            produced.append(Produced(seq, [tokens[r] for r in emitted], [found.get(r) for r in emitted]))
        return produced + step.read_drawn(values[2 * n + s :])
