"""A chain's proposals on their way to the host while the next verify step already runs on them.

The host needs a sequence's drafts for two things: how many there are (to schedule the verify step and
its blocks: known without the tokens) and what they are (to accept or reject them after that step's
forward). Their values can therefore stay on the device until the verify forward was launched: its draft
rows take them there (StepInputs.fed_source "drafts"), and the host reads them, in one copy started
right after the chain, once the forward is queued. Meanwhile the host schedules and prepares that step
while the chain runs instead of waiting for it.

Until then each proposing sequence holds placeholders (zeros) in draft_token_ids; the list object is
remembered, so a sequence whose drafts were dropped meanwhile (preemption, abort) is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.engine.execution.step_inputs import StepInputs
from atom_core.engine.scheduling.scheduler import ScheduledBatch
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.host_copy import PendingRead


@dataclass(slots=True)
class PendingProposals:
    """tokens: [N] int64 on the device, the tokens of every draft forward since the last target step in
    launch order, concatenated (what each tensor-parallel rank concatenates from its own forwards too).
    drafts: per proposing sequence, its placeholder draft list and where each of its drafts is in tokens."""

    tokens: torch.Tensor
    read: PendingRead
    drafts: list[tuple[Sequence, list[int], list[int]]]
    source: str = "drafts"  # what tokens are, as StepInputs.fed_source names it ("ahead": ahead_tokens')

    @classmethod
    def start(
        cls, tokens: torch.Tensor, where: list[tuple[Sequence, list[int]]], source: str = "drafts"
    ) -> PendingProposals:
        """Start the copy to the host, and give each sequence placeholders for its drafts."""
        drafts = []
        for seq, index in where:
            seq.draft_token_ids = [0] * len(index)
            drafts.append((seq, seq.draft_token_ids, index))
        return cls(tokens, PendingRead(tokens), drafts, source)

    def feed(self, batch: ScheduledBatch, inputs: StepInputs) -> torch.Tensor | None:
        """Point the batch's draft rows of still-pending sequences at their tokens; returns the tokens they
        are fed from, or None when no row is fed."""
        index_of = {id(placeholder): index for _, placeholder, index in self.drafts}
        row, drafts = 0, batch.drafts or [[]] * len(batch.seqs)
        for seq, n, draft in zip(batch.seqs, batch.num_new_tokens, drafts, strict=True):
            index = index_of.get(id(seq.draft_token_ids))
            if draft and index is not None:  # (the drafts are the step's last rows of the sequence)
                first = row + n - len(draft)
                inputs.fed_rows += range(first, first + len(draft))
                inputs.fed_from += index[: len(draft)]
            row += n
        if not inputs.fed_rows:
            return None
        inputs.fed_source = self.source
        return self.tokens

    def resolve(self, batch: ScheduledBatch) -> None:
        """Wait for the copy, write the drafts of every sequence still holding its placeholders, and the
        batch's (a prefix of each sequence's drafts, as scheduled)."""
        tokens = self.read.tolist()
        for seq, placeholder, index in self.drafts:
            if seq.draft_token_ids is placeholder:
                placeholder[:] = [tokens[i] for i in index]
        for i, draft in enumerate(batch.drafts):
            seq = batch.seqs[i]
            if draft:
                batch.drafts[i] = seq.draft_token_ids[: len(draft)]
