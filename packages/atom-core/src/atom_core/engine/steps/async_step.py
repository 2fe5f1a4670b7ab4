"""Async scheduling: the engine launches step k+1 before the host has read step k's tokens.

A step's host work (scheduling, input building, reading the sampled tokens, stop checks and
detokenization, outputs) otherwise sits between two forwards with the device idle. Here step k's tokens
are sampled on the device (every sampling parameter but penalties: sampler.sample_rows, with each row's
keyed uniform computed on the host when the step is prepared), step k+1's input ids take them on the
device (step_inputs.feed_sampled), and they travel to the host, with their logprobs, in non-blocking
copies (`InFlightStep`) that the engine reads after it has launched k+1. Outputs arrive one step later;
a sequence that stops at step k's token has one more token computed and dropped.

Step k+1 may admit waiting requests and run prefill chunks beside the decodes: only a sequence whose
next token is pending needs feeding, and its pending token is its first row of the step. The engine
launches ahead while every running and waiting request samples on the device (penalties need the
host's tokens) and the KV cache holds every running sequence's remaining tokens (so nothing is
preempted while a token is on its way) (`AsyncSteps.continues`). State layers need nothing more: a
step's state updates run on the device in stream order, and a slot a finished sequence gave back is
reset (fresh) by the next holder's first step, queued after the step in flight. Under speculation the
verify steps launch ahead instead (steps/speculative_ahead.py). Anything else settles the step in flight
first and runs as a synchronous step.

Structured outputs launch ahead too, where one process samples (no tensor parallelism): their step's
forward is launched without its draw; the host then reads the step before it, advances the rows'
grammars by those tokens (the emit stage), fills the rows' masks and queues the masked draw
(`AsyncSteps.sample_masked`), all while the forward runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.engine.execution.runner import StepResult
from atom_core.engine.execution.step_inputs import StepInputs
from atom_core.engine.sampling.sampler import (
    NON_FINITE,
    SAMPLING_FAILED,
    LogprobRows,
    SamplingRows,
    sample_rows,
)
from atom_core.engine.sampling_params import SamplingParams
from atom_core.engine.scheduling.scheduler import ScheduledBatch, Scheduler
from atom_core.engine.scheduling.sequence import Sequence, Status
from atom_core.engine.steps.emit import Produced
from atom_core.engine.steps.stats import StepStats
from atom_core.engine.structured.masking import mask_disallowed


def masked_on_device(params: SamplingParams) -> bool:
    """Whether a request's next token can be drawn on the device once the host has filled its grammar's
    mask (structured outputs, launched ahead where AsyncSteps.masks_ahead)."""
    return not params.penalized and params.prompt_logprobs is None and params.structured_outputs is not None


def sampled_on_device(params: SamplingParams) -> bool:
    """Whether a request's next token can be drawn on the device: all but penalties, which read the
    tokens so far (the one in flight included), prompt logprobs, which the synchronous step reads from
    its prefill chunks, and structured outputs, whose draw waits for the host's mask (masked_on_device)."""
    return not params.penalized and params.prompt_logprobs is None and params.structured_outputs is None


class HostTokens:
    """Two pinned host buffers the in-flight steps' tokens are copied into, used in turn: the buffer a
    step is read from is written again only two launches later, after that read."""

    def __init__(self, max_rows: int, device: torch.device):
        pin = device.type == "cuda"
        self.buffers = [torch.zeros(2 * max_rows, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self.events = [torch.cuda.Event() if pin else None for _ in range(2)]
        self.device = device
        self.turn = 0

    def take(self, rows: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        i, self.turn = self.turn, 1 - self.turn
        return self.buffers[i][: 2 * rows].view(2, rows), self.events[i]


@dataclass(slots=True)
class InFlightStep:
    """A launched step: its sampled sequences (one per logits row), their tokens and logprobs on the way."""

    seqs: list[Sequence]
    host: torch.Tensor  # [2, R] int64: each row's token and status (sampler.sample_rows)
    logprobs: LogprobRows | None
    top: list[int]  # how many top logprobs each row returns
    done: torch.cuda.Event | None

    @classmethod
    def launch(
        cls, seqs: list[Sequence], result: StepResult, rows: SamplingRows, buffers: HostTokens
    ) -> InFlightStep:
        """Start copying result's tokens (and logprobs) to the host; returns at once."""
        host, done = buffers.take(len(seqs))
        host.copy_(result.tokens, non_blocking=done is not None)
        logprobs = None if result.logprobs is None else result.logprobs.to_host(non_blocking=done is not None)
        if done is not None:  # on the engine's device's stream (not the current device's)
            done.record(torch.cuda.current_stream(buffers.device))
        return cls(seqs, host, logprobs, rows.logprobs, done)

    def read(self) -> tuple[list[int | None], list[str | None], dict[int, dict[int, float]]]:
        """Wait for the copies; returns each row's token (None where it failed), why it failed, and the
        logprobs of the rows that asked for them."""
        if self.done is not None:
            self.done.synchronize()
        tokens, status = self.host.tolist()
        errors = [None if s == 1 else NON_FINITE if s == 0 else SAMPLING_FAILED for s in status]
        tokens = [t if e is None else None for t, e in zip(tokens, errors, strict=True)]
        found = {} if self.logprobs is None else self.logprobs.dicts(tokens, self.top)
        return tokens, errors, found


class AsyncSteps:
    """The engine's one step in flight, and the rules for launching the next one before reading it."""

    def __init__(
        self,
        scheduler: Scheduler,
        stats: StepStats,
        max_rows: int,
        device: torch.device,
        *,
        masks_ahead: bool = False,
        backend: str | None = None,
    ):
        self.scheduler, self.stats, self.backend = scheduler, stats, backend
        self.host = HostTokens(max_rows, device)
        self.in_flight: InFlightStep | None = None
        self.result: StepResult | None = None  # the in-flight step's results (its tokens feed the next)
        self.enabled = True  # False: no step launches ahead (the one in flight settles at the next step)
        # structured outputs launch ahead (their draw waits for the host's masks): only where the draw is
        # this process's alone (a tensor-parallel rank draws its own, and would need the masks too)
        self.masks_ahead = masks_ahead
        self.unsampled: tuple[list[Sequence], StepResult, SamplingRows] | None = None  # launched, not drawn

    def _ahead(self, params: SamplingParams) -> bool:
        return sampled_on_device(params) or (self.masks_ahead and masked_on_device(params))

    def continues(self) -> bool:
        """Whether the next step can launch before the one in flight is read: every request running or
        waiting samples on the device, and the free KV blocks hold every running sequence's remaining
        tokens (no preemption takes a sequence whose token is on its way)."""
        scheduler, blocks = self.scheduler, self.scheduler.blocks
        running = scheduler.running
        return (
            self.enabled
            and bool(running)
            and all(self._ahead(seq.params) for seq in (*running, *scheduler.waiting))
            # every one-token row (a pending token, or a prompt's last) fits the budget: the scheduler
            # serves them all before any prefill chunk takes what they need
            and sum(seq.num_uncomputed == 1 for seq in running) <= scheduler.config.max_num_batched_tokens
            and sum(blocks.blocks_needed(seq, seq.num_uncomputed) for seq in running)
            <= blocks.num_free_blocks
        )

    def launches_ahead(self, batch: ScheduledBatch) -> bool:
        """Whether this batch's tokens stay on the device for the next step: none verifies drafts, and
        every one samples on the device."""
        return self.enabled and not any(batch.drafts) and all(self._ahead(seq.params) for seq in batch.seqs)

    @property
    def behind(self) -> None:
        """(No step's acceptance shifts a decode's rows.)"""
        return None

    def prepare(self, batch: ScheduledBatch, inputs: StepInputs) -> torch.Tensor | None:
        """A step launched ahead: every logits row sampled on the device, at its sequence's next output
        position; its pending tokens fed from the step in flight (feed)."""
        seqs = [batch.seqs[row] for row in inputs.ends]
        rows = SamplingRows.of(seqs, [len(s.output_token_ids) + s.num_pending for s in seqs])
        if any(s.grammar is not None for s in seqs):  # drawn after the forward, once the masks are in
            self.unsampled, inputs.sampling = (seqs, None, rows), None
        else:
            inputs.sampling = rows
        return self.feed(batch, inputs)

    def feed(self, batch: ScheduledBatch, inputs: StepInputs) -> torch.Tensor | None:
        """Point the rows of pending tokens at the in-flight step's tokens (a sequence's pending token is
        its first row of this step); returns those tokens ([R] int64), or None when nothing is in flight."""
        if self.in_flight is None:
            return None
        row_of = {id(seq): row for row, seq in enumerate(self.in_flight.seqs)}
        row = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            if seq.num_pending:
                inputs.fed_rows.append(row)
                inputs.fed_from.append(row_of[id(seq)])
            row += n
        if len(inputs.fed_rows) != sum(seq.num_pending for seq in self.scheduler.running):
            raise RuntimeError("async scheduling: a sequence's pending token was not scheduled")
        return self.result.sampled

    def drop(self) -> None:
        """The step in flight will not be read (its sequences failed with the step after it)."""
        self.in_flight = self.result = self.unsampled = None

    def launch(self, batch: ScheduledBatch, inputs: StepInputs, result: StepResult) -> list[Produced]:
        """After launching a step ahead: count its tokens as computed (and a sampled one pending per
        sequence with logits), start their copy to the host, then settle the step before it (the device
        runs this one meanwhile)."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.scheduler.blocks.register_full_blocks(seq)  # (prefill chunks' blocks: their ids are known)
        sampled = [batch.seqs[row] for row in inputs.ends]
        for seq in sampled:
            seq.num_pending += 1
        self.scheduler.settle_snapshots(batch, ran=True)
        if self.unsampled is not None:  # its draw waits for the step before to advance the grammars
            self.unsampled = (sampled, result, self.unsampled[2])
            previous, self.in_flight, self.result = self.in_flight, None, None
        else:
            launched = InFlightStep.launch(sampled, result, inputs.sampling, self.host)
            previous, self.in_flight, self.result = self.in_flight, launched, result
        if previous is None:
            return []
        self.stats.num_async_steps += 1
        return self._read(previous)

    def sample_masked(self) -> None:
        """After the step before was emitted (its tokens advanced the grammars): fill the masks of the
        launched step's rows, queue its draw behind its forward and start its tokens' copy. Rows whose
        sequence ended meanwhile draw unmasked (their tokens are dropped)."""
        if self.unsampled is None:
            return
        seqs, result, rows = self.unsampled
        self.unsampled = None
        with torch.inference_mode():
            finite = torch.isfinite(result.logits).all(dim=-1)
            live = [s if s.status is Status.RUNNING else None for s in seqs]
            mask_disallowed(result.logits, live)
            result.tokens, result.logprobs = sample_rows(
                result.logits, rows, backend=self.backend, finite=finite
            )
        self.in_flight, self.result = InFlightStep.launch(seqs, result, rows, self.host), result

    def forget_if_unread(self) -> None:
        """After the launch's settled tokens were emitted: a step in flight whose sequences all ended (at
        the step before it) is dropped, as nobody will read what it computes."""
        if self.in_flight is not None and not any(s.status is Status.RUNNING for s in self.in_flight.seqs):
            self.drop()

    def settle(self) -> list[Produced]:
        """Read the step in flight and take it off: its sequences' tokens, as a synchronous step's."""
        step = self.in_flight
        self.drop()
        return self._read(step)

    def _read(self, step: InFlightStep) -> list[Produced]:
        """An in-flight step's tokens. Sequences that ended meanwhile (a stop at the step before, an
        abort, a failure) drop theirs."""
        tokens, errors, logprobs = step.read()
        produced = []
        for row, (seq, token, error) in enumerate(zip(step.seqs, tokens, errors, strict=True)):
            if seq.status is not Status.RUNNING:
                continue
            seq.num_pending -= 1
            if error is None:
                produced.append(Produced(seq, [token], [logprobs.get(row)]))
            else:
                produced.append(Produced(seq, error=error))
        return produced
