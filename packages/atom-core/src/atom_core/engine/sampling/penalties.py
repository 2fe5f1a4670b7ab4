"""OpenAI/vLLM penalties on a row of logits: repetition over the prompt and output, presence and frequency
over the output, and min_tokens' ban on the stop tokens before that many. They read every token so far,
so they apply where the host knows them all."""

from __future__ import annotations

import torch

from atom_core.engine.scheduling.sequence import Sequence


def apply_penalties(row: torch.Tensor, seq: Sequence) -> None:
    """In place, as vLLM applies them: repetition over prompt and output tokens, presence and frequency
    over output tokens only.

    With a repetition penalty the row comes back shifted to a maximum of 0: dividing by a small penalty
    (validation accepts any in (0, 2]) takes logits past fp32's range, and softmax, argmax and log-softmax,
    all that reads the row, do not change under a shift."""
    p = seq.params
    if len(seq.output_token_ids) < p.min_tokens and seq.min_tokens_stops:  # it may not stop yet
        row[torch.tensor(sorted(seq.min_tokens_stops), device=row.device)] = float("-inf")
    if p.repetition_penalty != 1:
        _apply_repetition_penalty(row, torch.tensor(sorted(set(seq.token_ids)), device=row.device), p)
    if seq.output_token_ids and (p.presence_penalty or p.frequency_penalty):
        counts = torch.bincount(torch.tensor(seq.output_token_ids, device=row.device), minlength=row.numel())
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


def _apply_repetition_penalty(row: torch.Tensor, seen: torch.Tensor, p) -> None:
    """row [V] fp32, in place: seen tokens' positive logits divided by the penalty, negative ones
    multiplied, in float64, then the whole row shifted by its maximum and rounded back to fp32."""
    penalty = p.repetition_penalty
    wide = row.double()
    values = wide[seen]
    positive = values > 0
    wide[seen] = torch.where(positive, values / penalty, values * penalty)
    top = wide.max()
    if torch.isinf(top):
        # Past float64 too (a penalty under ~1e-270): the largest seen positive logit is then the row's
        # maximum by hundreds of orders of magnitude; the others' distances to it, divided, are what is left.
        best = values[positive].max()
        wide.fill_(float("-inf"))
        wide[seen] = torch.where(positive, (values - best) / penalty, float("-inf"))
        top = wide.new_zeros(())
    row.copy_((wide - top).float())
