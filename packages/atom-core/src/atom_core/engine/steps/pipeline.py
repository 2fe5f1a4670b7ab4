"""One engine step as a pipeline: schedule, prepare the inputs, run the forward, turn its results into
tokens (synchronously, launched ahead of the host, or by verifying drafts), emit outputs, and (with a
draft) propose the next step's drafts."""

from __future__ import annotations

from atom_core.engine.execution.runner import Runner, StepResult
from atom_core.engine.execution.step_inputs import StepInputs, prepare_step
from atom_core.engine.outputs import RequestOutput
from atom_core.engine.plan import CachePlan
from atom_core.engine.sampling.prompt_logprobs import record_prompt_logprobs
from atom_core.engine.scheduling.scheduler import ScheduledBatch, Scheduler
from atom_core.engine.scheduling.sequence import Status
from atom_core.engine.speculation.drafting import Drafter
from atom_core.engine.speculation.verify import verify_sampling
from atom_core.engine.steps.async_step import AsyncSteps
from atom_core.engine.steps.emit import Emitter
from atom_core.engine.steps.failures import Failures
from atom_core.engine.steps.speculative_ahead import SpeculativeAhead
from atom_core.engine.steps.speculative_step import verify_step
from atom_core.engine.steps.stats import StepStats
from atom_core.engine.steps.sync_step import sample_step
from atom_core.host_copy import PendingRead


class StepPipeline:
    def __init__(
        self,
        plan: CachePlan,
        runner: Runner,
        scheduler: Scheduler,
        emitter: Emitter,
        drafter: Drafter | None,
        failures: Failures,
        stats: StepStats,
        *,
        kernel_backend: str | None,
        device,
        masks_ahead: bool = False,
    ):
        self.runner, self.scheduler, self.emitter, self.drafter = runner, scheduler, emitter, drafter
        self.failures, self.stats, self.backend = failures, stats, kernel_backend
        self.overlap: AsyncSteps | SpeculativeAhead | None = None
        if plan.async_scheduling:  # launched ahead: decodes, or (with a draft) verifies
            self.overlap = (
                AsyncSteps(
                    scheduler,
                    stats,
                    plan.max_num_seqs,
                    device,
                    masks_ahead=masks_ahead,
                    backend=kernel_backend,
                )
                if drafter is None
                else SpeculativeAhead(scheduler, drafter, stats, plan)
            )

    def step(self) -> list[RequestOutput]:
        """One scheduled forward; returns the outputs of the requests it advanced (finished ones included).

        With async scheduling a greedy decode step returns the outputs of the step before it (the first
        returns none), and a step that cannot be launched ahead returns the one in flight's alone."""
        overlap = self.overlap
        in_flight = overlap is not None and overlap.in_flight is not None
        if in_flight and not overlap.continues():
            return self.emitter.emit(overlap.settle())
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        ahead = overlap is not None and overlap.launches_ahead(batch)
        if in_flight and not ahead:
            # continues() admits only batches that launch ahead, but admissions may have taken the
            # blocks a verify's chain needed, or the budget its drafts: read the step in flight, then
            # schedule again from what it computed (nothing was preempted or restored: continues())
            self.scheduler.settle_snapshots(batch, ran=False)
            if batch.restores:
                raise RuntimeError("async scheduling: a step in flight met a state restore")
            settled = self.emitter.emit(overlap.settle())
            batch = self.scheduler.schedule()
            if not batch.seqs:
                return settled
            return settled + self._run(batch, overlap.launches_ahead(batch), False)
        return self._run(batch, ahead, in_flight)

    def _run(self, batch: ScheduledBatch, ahead: bool, in_flight: bool) -> list[RequestOutput]:
        """The scheduled batch's forward(s), launched ahead of the host or not, and their outputs."""
        overlap = self.overlap
        # a verify launched ahead runs its prefill chunks in a forward of their own (speculative_ahead.py)
        split = ahead and self.drafter is not None
        verify, prefills = overlap.split(batch) if split else (batch, None)
        try:
            inputs = prepare_step(verify)
            if ahead:  # every logits row sampled on the device; its fed rows take the step in flight's
                if prefills is not None:  # first: a failure there fails the batch with nothing ahead
                    overlap.run_prefills(prefills, self.runner)
                fed = overlap.prepare(verify, inputs)
                result = self.runner.run(inputs, fed, overlap.behind)
                if self.drafter is not None:  # its catch-up and chain, before anything is read
                    try:
                        self.drafter.launch_ahead(verify, inputs, result, overlap.prefill)
                    except Exception as err:  # the verify ran: as a synchronous verify's failed proposal
                        return self._draft_failed_ahead(batch, verify, inputs, result, err)
            else:
                if self.drafter is not None and any(batch.drafts):  # verify rows drawn in the forward
                    ends = inputs.ends
                    inputs.sampling = verify_sampling(
                        [batch.seqs[r] for r in ends], [batch.drafts[r] for r in ends]
                    )
                fed = self.drafter.feed(batch, inputs) if self.drafter is not None else None
                result = self.runner.run(inputs, fed)
            if self.drafter is not None and not ahead:  # read the drafts it verifies, now it is queued
                self.drafter.resolve(batch)
        except Exception as err:  # one forward serves the whole batch: find whose requests it fails
            if split:
                overlap.forget_prefills()
            self.scheduler.settle_snapshots(batch, ran=False)
            if self.drafter is not None and self.drafter.pending is not None:
                try:  # a rerun in halves feeds from the host
                    self.drafter.resolve(batch)
                except Exception:
                    return self.failures.forward_failed(batch.seqs, "model", err)
            # the step in flight ran: its tokens are read first, so the batch's sequences hold no pending
            # token and the failed one can be rerun in halves as a synchronous step would be
            if not in_flight:
                return self.failures.step_failed(batch, err, self.advance)
            settled = self.emitter.emit(overlap.settle())
            rows = [i for i, seq in enumerate(batch.seqs) if seq.status is Status.RUNNING]
            if not rows:  # all of them stopped at the step that was in flight
                return settled
            left = ScheduledBatch(
                [batch.seqs[i] for i in rows],
                [batch.num_new_tokens[i] for i in rows],
                [batch.drafts[i] for i in rows],
            )
            return settled + self.failures.step_failed(left, err, self.advance)
        self.stats.consecutive_failures = 0
        if ahead:
            advanced, failed = self.emitter.apply(overlap.launch(verify, inputs, result))
            overlap.sample_masked()  # (structured rows: their masks follow the tokens just applied)
            outputs = self.emitter.report(advanced, failed)
            overlap.forget_if_unread()
            return outputs
        return self.advance(batch, inputs, result)

    def _draft_failed_ahead(
        self,
        batch: ScheduledBatch,
        verify: ScheduledBatch,
        inputs: StepInputs,
        result: StepResult,
        err: Exception,
    ) -> list[RequestOutput]:
        """A draft forward launched after a verify that ran ahead failed: the step in flight and this
        verify (with the prefills beside it) are read and emitted, then the batch's requests still
        running fail with the draft model named."""
        self.stats.consecutive_failures = 0
        outputs = self.emitter.emit(self.overlap.launch(verify, inputs, result))
        outputs += self.emitter.emit(self.overlap.settle())
        self.drafter.pending = None  # (its chain never ran)
        running = [s for s in batch.seqs if s.status is Status.RUNNING]
        return outputs + self.failures.forward_failed(running, "draft model", err)

    def advance(self, batch: ScheduledBatch, inputs: StepInputs, result: StepResult) -> list[RequestOutput]:
        """After a synchronous forward: sample (or verify drafts), emit, then propose the next drafts. With
        drafts drawn in the forward, the draft's catch-up is launched before the host reads them, so it
        runs while the host verifies and emits."""
        if result.prompt_logprobs is not None:
            record_prompt_logprobs(batch.seqs, inputs.prompt_owners, result.prompt_logprobs)
        if self.drafter is None:
            return self.emitter.emit(sample_step(batch, inputs, result, self.scheduler, self.backend))
        # the forward's draws start for the host before the catch-up is queued behind them
        drawn = PendingRead(result.tokens) if result.tokens is not None else None
        caught_up, draft_error = None, None
        try:
            caught_up = self.drafter.catch_up(batch, inputs, result)
        except Exception as err:  # reported after the step's tokens, as a failed proposal is
            draft_error = err
        advanced, failed = self.emitter.apply(
            verify_step(batch, inputs, result, self.scheduler, self.stats, self.backend, drawn)
        )
        errors = []
        try:
            if draft_error is not None:
                raise draft_error
            self.drafter.propose(batch, inputs, result, caught_up)
        except Exception as err:  # as a failed target forward: its requests end with the error
            running = [s for s in batch.seqs if s.status is Status.RUNNING]
            errors = self.failures.forward_failed(running, "draft model", err)
        return errors + self.emitter.report(advanced, failed)
