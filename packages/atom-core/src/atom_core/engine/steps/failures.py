"""When a forward fails: whose requests fail with it. A forward serves its whole batch, so by default all
of the batch's requests fail (the log has the traceback) and later ones may run; where rerunning is safe,
the batch is split to find the requests whose own forward fails."""

from __future__ import annotations

import logging
from collections.abc import Callable

from atom_core.engine.execution.runner import Runner, StepResult
from atom_core.engine.execution.step_inputs import StepInputs, prepare_step
from atom_core.engine.outputs import RequestOutput
from atom_core.engine.scheduling.scheduler import ScheduledBatch
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.engine.steps.requests import RequestTable
from atom_core.engine.steps.stats import StepStats

logger = logging.getLogger("atom.engine")

Advance = Callable[[ScheduledBatch, StepInputs, StepResult], list[RequestOutput]]


class Failures:
    def __init__(self, runner: Runner, requests: RequestTable, stats: StepStats, *, rerun_safe: bool):
        """rerun_safe: whether a failed forward changed nothing a sequence reads (see isolate)."""
        self.runner, self.requests, self.stats, self.rerun_safe = runner, requests, stats, rerun_safe

    def forward_failed(self, seqs: list[Sequence], model: str, err: Exception) -> list[RequestOutput]:
        """seqs' requests fail (the log has the traceback); later ones may run."""
        logger.exception("a %s forward failed; its %d sequences' requests fail", model, len(seqs))
        self.stats.consecutive_failures += 1
        reason = f"the {model}'s forward failed ({type(err).__name__}; the server log has the details)"
        return self.requests.fail(dict.fromkeys((s.request_id for s in seqs), reason))

    def step_failed(self, batch: ScheduledBatch, err: Exception, advance: Advance) -> list[RequestOutput]:
        """A step's forward failed (no token of its batch is pending: a step in flight was read first):
        its requests fail, or, where rerunning is safe and it served several requests, only those whose
        own forward fails."""
        if not self.rerun_safe or len({seq.request_id for seq in batch.seqs}) == 1:
            return self.forward_failed(batch.seqs, "model", err)
        return self.isolate(batch, err, advance)

    def isolate(self, batch: ScheduledBatch, err: Exception, advance: Advance) -> list[RequestOutput]:
        """Run each half of the batch's requests on its own, and halves of what fails again, so that only
        the requests whose own forward fails fail (a request's samples stay together). Rerunning is safe
        because a failed forward changed nothing a sequence reads: its KV rows lie past
        num_computed_tokens, to be written again (models with state layers, whose forward updates their
        state in place, are not rerun, nor tensor-parallel ones, whose ranks may have stopped apart). The
        step counts as one failure of the engine, and as none if any part of it ran."""
        logger.warning(
            "a model forward over %d sequences failed (%s): running them in halves to find the cause",
            len(batch.seqs),
            type(err).__name__,
        )
        before = self.stats.consecutive_failures
        outputs, ran = self._rerun(batch, advance)
        self.stats.consecutive_failures = 0 if ran else before + 1
        return outputs

    def _rerun(self, batch: ScheduledBatch, advance: Advance) -> tuple[list[RequestOutput], bool]:
        """batch's requests forwarded in two halves; the outputs, and whether any forward ran."""
        outputs, ran = [], False
        for half in _halves(batch):
            try:
                inputs = prepare_step(half)
                result = self.runner.run(inputs)
            except Exception as again:
                if len({seq.request_id for seq in half.seqs}) == 1:
                    outputs += self.forward_failed(half.seqs, "model", again)
                else:
                    more, more_ran = self._rerun(half, advance)
                    outputs, ran = outputs + more, ran or more_ran
                continue
            ran = True
            outputs += advance(half, inputs, result)
        return outputs, ran


def _halves(batch: ScheduledBatch) -> list[ScheduledBatch]:
    """batch's requests in two batches, each request's samples together (no state snapshots: only models
    without state layers rerun)."""
    requests = list(dict.fromkeys(seq.request_id for seq in batch.seqs))
    first = set(requests[: len(requests) // 2])
    halves = []
    for part in (first, set(requests) - first):
        rows = [i for i, seq in enumerate(batch.seqs) if seq.request_id in part]
        halves.append(
            ScheduledBatch(
                [batch.seqs[i] for i in rows],
                [batch.num_new_tokens[i] for i in rows],
                [batch.drafts[i] for i in rows],
            )
        )
    return halves
