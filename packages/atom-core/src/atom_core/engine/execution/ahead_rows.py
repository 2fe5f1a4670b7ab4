"""The device side of a speculative step launched ahead: what the host does not know yet, the device
computes.

A verify step N is launched before the host has read step N - 1's acceptance, which N - 1 counted on the
device (atom-kernels' accepted_drafts: StepResult.accepted and .rejected). The host schedules and
prepares N as if every draft of N - 1 was accepted (its positions, sequence lengths and KV blocks the
largest they can be); each sequence's rows then sit `lag` = its rejected drafts before that (lag_behind),
which the device subtracts from the step's positions and sequence lengths and from which it recomputes
the cache slots (atom-kernels' move_rows_back, one launch a forward; in a graph's static buffers, their
own). N's tokens come from N - 1 on the device as well: the bonus token, which is the target's draw at
the first rejected draft, then the drafts chained from it (ahead_tokens).

State layers keep each token's state of a verify in one of the sequence's k + 1 slots; the host then
makes the last accepted one's slot the sequence's own (Sequence.commit_state). A verify launched ahead
starts from that slot, which the device picks in its place (commit_states).

Within one verify step, every forward has the same sequences in the same order: the verify, the draft's
catch-up over its k + 1 rows (the same positions), and the chained draft forwards, whose rows follow the
accepted drafts: they sit the verify's own rejected drafts further back, and the first of them reads the
catch-up's row of the last accepted draft.
"""

from __future__ import annotations

import torch

from atom_core.attention import PagedAttentionMetadata
from atom_core.engine.execution.runner import DraftResult, StepResult
from atom_core.host_copy import to_device
from atom_kernels.cache import move_rows_back


def lag_behind(behind: StepResult | None, shift_from: list[int]) -> torch.Tensor:
    """[S] int64: how far each sequence of a step after the verify `behind` (launched ahead) sits before
    the host's positions: the drafts `behind` rejected of the sequence at shift_from[i] there."""
    if behind is None or behind.rejected is None:
        raise RuntimeError("a step follows a verify launched ahead, but none was given")
    lag = behind.rejected
    if shift_from == list(range(lag.shape[0])):  # nothing ended since (the usual step): as it is
        return lag
    return lag[to_device(shift_from, torch.long, lag.device)]


def ahead_tokens(target: StepResult, drafts: list[DraftResult]) -> torch.Tensor:
    """[S * q] int64: per sequence of a verify launched ahead, the next verify's tokens: the bonus token
    (the draw at its first rejected draft, or after the last), then its next drafts: the catch-up's
    proposal at the last accepted row (drafts[0]), then each chained forward's (drafts[1:])."""
    accepted = target.accepted[:, None]
    s = accepted.shape[0]
    bonus = target.tokens[0].view(s, -1).gather(1, accepted)
    first = drafts[0].tokens.view(s, -1).gather(1, accepted)
    return torch.cat([bonus, first, *(d.tokens.view(s, 1) for d in drafts[1:])], dim=1).view(-1)


def move_back(
    meta: PagedAttentionMetadata,
    positions: torch.Tensor,
    lag: torch.Tensor,
    block_size: int,
    backend: str | None,
) -> None:
    """An eager forward's uniform rows (and their metadata), each sequence's moved back by its lag [S]."""
    q = positions.shape[0] // lag.shape[0]
    tables = meta.block_tables
    move_rows_back(positions, meta.seq_lens, meta.slot_mapping, tables, lag, q, block_size, backend=backend)


def commit_states(step_slots: torch.Tensor, slots: torch.Tensor, lag: torch.Tensor, q: int) -> None:
    """In place, for a verify launched ahead of the host's commit: each sequence's q state slots in
    step_slots [S * q] (its own first, then a spare a draft, as the host last knew them) become what
    Sequence.commit_state(accepted) makes of them after the verify before, whose rejected drafts are lag
    [S]: the last accepted token's slot first, then the others in order; slots [S] take the first."""
    s = lag.shape[0]
    group = step_slots[: s * q].view(s, q)
    accepted = (q - 1) - lag[:, None]
    others = torch.arange(q - 1, device=lag.device)[None, :]
    order = torch.cat([accepted, others + (others >= accepted).long()], dim=1)
    group.copy_(group.gather(1, order))
    slots[:s] = group[:, 0]
