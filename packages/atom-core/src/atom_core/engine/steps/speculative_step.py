"""The speculative step's turn from results to tokens: each sequence's drafts are verified against the
target's logits (speculation/verify.py), the KV and state of accepted positions kept, and the emitted
tokens are the accepted drafts and the target's own token after them."""

from __future__ import annotations

from atom_core.engine.execution.runner import StepResult
from atom_core.engine.execution.step_inputs import StepInputs
from atom_core.engine.scheduling.scheduler import ScheduledBatch, Scheduler
from atom_core.engine.speculation.verify import verify
from atom_core.engine.steps.emit import Produced
from atom_core.engine.steps.stats import StepStats
from atom_core.host_copy import PendingRead


def verify_step(
    batch: ScheduledBatch,
    inputs: StepInputs,
    result: StepResult,
    scheduler: Scheduler,
    stats: StepStats,
    backend: str | None,
    drawn: PendingRead | None = None,
) -> list[Produced]:
    """drawn: the forward's draws of every row (verify_sampling) on their way to the host; None: drawn
    here."""
    sampled = [batch.seqs[row] for row in inputs.ends]
    drafts = [batch.drafts[row] for row in inputs.ends]
    verified = verify(result.logits, sampled, drafts, backend=backend, drawn=drawn)
    accepted = dict(zip(inputs.ends, verified.accepted, strict=True))
    for row, (seq, n, draft) in enumerate(zip(batch.seqs, batch.num_new_tokens, batch.drafts, strict=True)):
        # rejected drafts' KV rows stay behind num_computed_tokens: overwritten, never read
        seq.num_computed_tokens += n - len(draft) + accepted.get(row, 0)
        if draft and seq.state_slot >= 0:  # state layers kept each token's state: keep the accepted
            seq.commit_state(accepted.get(row, 0))
        scheduler.blocks.register_full_blocks(seq)
    scheduler.settle_snapshots(batch, ran=True)
    produced = []
    for seq, draft, tokens, lps, n_ok, error in zip(
        sampled, drafts, verified.tokens, verified.logprobs, verified.accepted, verified.errors, strict=True
    ):
        if error is not None:
            produced.append(Produced(seq, error=error))
            continue
        seq.num_drafted += len(draft)
        seq.num_accepted += n_ok
        stats.num_draft_tokens += len(draft)
        stats.num_accepted_tokens += n_ok
        stats.num_verifications += bool(draft)
        produced.append(Produced(seq, tokens, lps))
    return produced
