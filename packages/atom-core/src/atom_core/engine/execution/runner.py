"""What the engine asks of a runner (one process's ModelRunner, or rank 0 of a tensor-parallel group), and
what a step gives back: results travel as return values, never as fields left on the runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from atom_core.engine.execution.step_inputs import DraftInputs, StepInputs
from atom_core.engine.plan import CachePlan
from atom_core.engine.sampling.sampler import LogprobRows


@dataclass(slots=True)
class StepResult:
    """One target forward's results, all on the device.

    logits: [R, V], one row per inputs.logit_rows entry. hidden: [T, H], the hidden state of every token
    row (kept only when a speculative draft reads them; else None). tokens: [2, R] int64, each logits
    row's sampled token and status (sampler.sample_rows), and logprobs the rows that asked for them
    (only when inputs.sampling says how to sample)."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    logprobs: LogprobRows | None = None
    # a verify launched ahead (inputs.verify_ahead), per sequence [S] int64: its accepted and rejected
    # drafts, how many positions its rows sat before the host's (the step before it's rejected ones), the
    # flat row of its last accepted token and how far the draft rows chained after it sit back
    accepted: torch.Tensor | None = None
    rejected: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    last_rows: torch.Tensor | None = None
    chain_shift: torch.Tensor | None = None
    # inputs.prompt_rows' {token: logprob}, read on the host (SamplingParams.prompt_logprobs)
    prompt_logprobs: list[dict[int, float]] | None = None

    @property
    def sampled(self) -> torch.Tensor | None:
        """[R] int64: the tokens a later step's fed rows take (async scheduling)."""
        return None if self.tokens is None else self.tokens[0]


@dataclass(slots=True)
class DraftResult:
    """One draft forward's results: logits [len(logit_rows), V], the draft's hidden states at those rows
    [len(logit_rows), H] (a chained draft forward reads them) and each row's argmax [len(logit_rows)]
    int64 (its proposal, which a chained forward's fed rows take on the device)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    tokens: torch.Tensor
    # rows that follow a verify launched ahead (DraftInputs.ahead): how many positions each sequence's rows
    # sat before the host's [S], and (a catch-up) that verify, whose acceptance the chain after it follows
    shift: torch.Tensor | None = None
    follows: StepResult | None = None


class Runner(Protocol):
    """The engine's view of whatever runs the model."""

    plan: CachePlan
    weight_bytes: int  # the model's (and its draft's) parameters on this process's device

    def run(
        self, inputs: StepInputs, fed: torch.Tensor | None = None, behind: StepResult | None = None
    ) -> StepResult:
        """The target forward of one step. fed: [N] int64 on the device, the tokens inputs.fed_rows take
        (at inputs.fed_from), as inputs.fed_source names them. behind: the verify step launched before
        this one, whose acceptance shifts this step's rows (inputs.shift_from)."""
        ...

    def run_draft(self, inputs: DraftInputs, source: StepResult | DraftResult) -> DraftResult:
        """One speculative draft forward reading source's hidden states at inputs.hidden_rows (and, for
        inputs.fed_rows, source's tokens)."""
        ...

    def shutdown(self) -> None: ...
