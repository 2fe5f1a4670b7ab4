"""The device side of a speculative step launched ahead: what the host does not know yet, the device
computes.

A verify step N is launched before the host has read step N - 1's acceptance. The host schedules and
prepares it as if every draft of N - 1 was accepted (its positions, sequence lengths and KV blocks the
largest they can be); each sequence's rows then sit `lag` = k - accepted positions before that, which the
device subtracts from the step's positions and sequence lengths and from which it recomputes the cache
slots (shift_rows). The step's tokens come from N - 1 on the device as well: the bonus token, which is the
target's draw at the first rejected draft, then the drafts chained from it (ahead_tokens).

Within one verify step, every forward has the same sequences in the same order: the verify, the draft's
catch-up over its k + 1 rows (the same positions), and the chained draft forwards, whose rows follow the
accepted drafts: they sit the verify's own rejected drafts further back, and the first of them reads the
catch-up's row of the last accepted draft.
"""

from __future__ import annotations

import torch

from atom_core.engine.execution.runner import DraftResult, StepResult


def accepted_drafts(draws: torch.Tensor, ids: torch.Tensor, q: int) -> torch.Tensor:
    """draws, ids: [S * q] int64, each sequence's q rows (its last known token, then its q - 1 drafts):
    the target's draw at each row and the row's input token -> [S] int64, how many leading drafts equal
    the draw before them (the draw at row j is the target's token at draft j + 1's position)."""
    drawn, fed = draws.view(-1, q), ids.view(-1, q)
    return (drawn[:, :-1] == fed[:, 1:]).long().cumprod(dim=1).sum(dim=1)


def rejected_drafts(result: StepResult) -> torch.Tensor:
    """[S] int64: each sequence's drafts the verify launched ahead did not accept (the lag of what follows)."""
    q = result.tokens.shape[1] // result.accepted.shape[0]
    return (q - 1) - result.accepted


def ahead_tokens(target: StepResult, drafts: list[DraftResult]) -> torch.Tensor:
    """[S * q] int64: per sequence of a verify launched ahead, the next verify's tokens: the bonus token
    (the draw at its first rejected draft, or after the last), then its next drafts: the catch-up's
    proposal at the last accepted row (drafts[0]), then each chained forward's (drafts[1:])."""
    accepted = target.accepted[:, None]
    s = accepted.shape[0]
    bonus = target.tokens[0].view(s, -1).gather(1, accepted)
    first = drafts[0].tokens.view(s, -1).gather(1, accepted)
    return torch.cat([bonus, first, *(d.tokens.view(s, 1) for d in drafts[1:])], dim=1).view(-1)


def shift_rows(
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    lag: torch.Tensor,
    q: int,
    block_size: int,
) -> None:
    """In place, for S sequences of q rows each (the first S * q entries): positions [S * q] int64 and
    seq_lens [S] int32 move back by each sequence's lag [S] int64, and slots [S * q] int64 are recomputed
    from the moved positions and block_tables [S, P] int32."""
    s = lag.shape[0]
    moved = positions[: s * q].view(s, q)
    moved -= lag[:, None]
    seq_lens[:s] -= lag.to(seq_lens.dtype)
    pages = block_tables[:s].gather(1, (moved // block_size).to(torch.long)).to(torch.long)
    slots[: s * q] = (pages * block_size + moved % block_size).view(-1)
