"""A verify launched ahead, on its way to the host: its draws, statuses and acceptance counts (and the
first tokens of the prefills launched beside it) in one copy, read one step later."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.engine.execution.runner import StepResult
from atom_core.engine.sampling.sampler import NON_FINITE, SAMPLING_FAILED, LogprobRows, SamplingRows
from atom_core.engine.scheduling.sequence import Sequence, Status
from atom_core.engine.speculation.prefill_drafts import PrefillPart
from atom_core.engine.steps.emit import Produced
from atom_core.host_copy import PendingRead


@dataclass(slots=True)
class InFlightVerify:
    """A verify launched ahead: its sequences (k + 1 rows each), and on their way to the host each row's
    draw and status, each sequence's accepted drafts, and the logprobs of the rows that asked."""

    seqs: list[Sequence]
    read: PendingRead  # [2 * S * q + S + 2 * D] int64: draws, statuses, accepted; the prefills' draws
    logprobs: LogprobRows | None
    top: list[int]
    result: StepResult  # (the next step's rows follow its acceptance)
    # prefills launched beside it: the D sequences whose first token was drawn, their logprobs
    drawn: list[Sequence]
    drawn_logprobs: LogprobRows | None = None
    drawn_top: list[int] | None = None

    @classmethod
    def launch(
        cls, seqs: list[Sequence], result: StepResult, rows: SamplingRows, part: PrefillPart | None
    ) -> InFlightVerify:
        host = lambda lps: None if lps is None else lps.to_host(non_blocking=True)  # noqa: E731
        parts = [result.tokens.view(-1), result.accepted]
        drawn, drawn_logprobs, drawn_top = [], None, None
        if part is not None and part.inputs.ends:
            drawn, drawn_logprobs = part.drawn, host(part.result.logprobs)
            drawn_top = part.inputs.sampling.logprobs
            parts.append(part.result.tokens.view(-1))
        logprobs = host(result.logprobs)
        # one copy (after the logprobs': its wait covers them)
        read = PendingRead(torch.cat(parts))
        return cls(seqs, read, logprobs, rows.logprobs, result, drawn, drawn_logprobs, drawn_top)

    def read_drawn(self, values: list[int]) -> list[Produced]:
        """The first tokens of the prefills launched beside a verify (as a synchronous step's)."""
        d = len(self.drawn)
        tokens, status = values[:d], values[d:]
        found = {} if self.drawn_logprobs is None else self.drawn_logprobs.dicts(tokens, self.drawn_top)
        produced = []
        for row, seq in enumerate(self.drawn):
            if seq.status is not Status.RUNNING:
                continue
            seq.num_pending -= 1
            if status[row] == 1:
                produced.append(Produced(seq, [tokens[row]], [found.get(row)]))
            else:
                produced.append(Produced(seq, error=NON_FINITE if status[row] == 0 else SAMPLING_FAILED))
        return produced
