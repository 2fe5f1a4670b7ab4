"""The synchronous step's turn from results to tokens: the batch's tokens count as computed, and every
sequence that reached its last known token samples its next one on the host's schedule."""

from __future__ import annotations

from atom_core.engine.execution.runner import StepResult
from atom_core.engine.execution.step_inputs import StepInputs
from atom_core.engine.sampling.sampler import sample
from atom_core.engine.scheduling.scheduler import ScheduledBatch, Scheduler
from atom_core.engine.steps.emit import Produced


def mark_computed(batch: ScheduledBatch, scheduler: Scheduler) -> None:
    """After a forward that ran: the batch's new tokens are in the cache, its full blocks findable, and
    the state snapshots it saved kept."""
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        seq.num_computed_tokens += n
        scheduler.blocks.register_full_blocks(seq)
    scheduler.settle_snapshots(batch, ran=True)


def sample_step(
    batch: ScheduledBatch, inputs: StepInputs, result: StepResult, scheduler: Scheduler, backend: str | None
) -> list[Produced]:
    """A step without drafts: one token for each sequence with logits (inputs.ends), in their order."""
    mark_computed(batch, scheduler)
    seqs = [batch.seqs[row] for row in inputs.ends]
    sampled = sample(result.logits, seqs, backend=backend)
    return [
        Produced(seq, [token], [lp], error) if error is None else Produced(seq, error=error)
        for seq, token, lp, error in zip(seqs, sampled.tokens, sampled.logprobs, sampled.errors, strict=True)
    ]
