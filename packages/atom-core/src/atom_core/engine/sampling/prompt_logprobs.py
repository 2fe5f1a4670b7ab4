"""Prompt logprobs (SamplingParams.prompt_logprobs): the logprob of each prompt token given the ones
before it, read from the hidden states of the prefill chunk that computed them, and where they go."""

from __future__ import annotations

from collections.abc import Callable

import torch

from atom_core.engine.sampling.sampler import token_logprobs

# logits rows computed at once: a chunk of thousands of prompt rows over a vocabulary of ~150k would
# need gigabytes of logits; a slice of this many keeps them to a few hundred megabytes at most
ROWS_AT_ONCE = 256


def score_prompt_rows(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    rows: list[int],
    targets: list[int],
    tops: list[int],
) -> list[dict[int, float]]:
    """hidden: [T, H], a forward's token rows; rows[i] scores token targets[i] (the prompt's next one).
    Returns per row {token: logprob} of its target and its tops[i] most likely tokens (raw logits)."""
    scored = []
    for s in range(0, len(rows), ROWS_AT_ONCE):
        at = torch.tensor(rows[s : s + ROWS_AT_ONCE], dtype=torch.long, device=hidden.device)
        logits = compute_logits(hidden[at])
        scored += token_logprobs(logits, targets[s : s + ROWS_AT_ONCE], tops[s : s + ROWS_AT_ONCE])
    return scored


def record_prompt_logprobs(seqs: list, owners: list[int], scored: list[dict[int, float]]) -> None:
    """Append each scored prompt position to its sequence's prompt_logprobs, in position order."""
    for owner, entry in zip(owners, scored, strict=True):
        seqs[owner].prompt_logprobs.append(entry)
