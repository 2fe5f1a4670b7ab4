"""A step's model inputs as plain lists (what rank 0 sends to the other tensor-parallel ranks), and their
preparation from a scheduled batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from atom_core.engine.sampling.sampler import SamplingRows
from atom_core.engine.scheduling.scheduler import ScheduledBatch
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.host_copy import to_device


@dataclass(slots=True)
class StepInputs:
    """One step's target forward: T token rows of S sequences (ids, positions: [T]; per sequence: query and
    sequence lengths, block table, state slot)."""

    ids: list[int]
    positions: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    ends: list[int]  # rows whose sequence reaches its last known token: they get logits
    state_slots: list[int]  # each sequence's state slot (-1 where the model has no state layers)
    fresh: list[bool]  # the sequence's first tokens are in this step (its state starts from zero)
    logit_rows: list[int]  # token rows that get logits: a sequence's last known token, then its drafts
    # state layers under speculation: per token of the leading sequences that verify drafts, the state
    # slot that keeps the state after it (their own for the known token, a spare one per draft)
    step_slots: list[int] = field(default_factory=list)
    # state slot copies (source, destination): snapshots restored before the forward, kept after it (a
    # sequence's state at the end of its chunk)
    state_copies: list[tuple[int, int]] = field(default_factory=list)
    state_saves: list[tuple[int, int]] = field(default_factory=list)
    # per sequence, a state the forward keeps partway through its chunk: the snapshot slot (-1: none) and
    # the chunk's tokens before it (empty: no sequence keeps one)
    snapshot_slots: list[int] = field(default_factory=list)
    snapshot_lens: list[int] = field(default_factory=list)
    # async scheduling: sample every logits row on the device as these rows say (StepResult.tokens), for
    # the next step, whose token rows fed_rows take them from rows fed_from (their ids here are placeholders)
    sampling: SamplingRows | None = None
    fed_rows: list[int] = field(default_factory=list)
    fed_from: list[int] = field(default_factory=list)
    # what fed_from indexes: "target", the last target step's sampled tokens (async scheduling); "drafts",
    # the tokens of every draft forward since it, concatenated in launch order (a verify step's drafts);
    # "ahead", the next tokens of the verify step launched ahead (execution/ahead_rows.ahead_tokens)
    fed_source: str = "target"
    # a verify step launched ahead (every sequence verifies verify_ahead drafts): the forward counts each
    # sequence's accepted drafts on the device (StepResult.accepted), the next step's lag
    verify_ahead: int = 0
    # per sequence, its index in the verify step launched before this one, whose acceptance this step's
    # positions assumed full: its rows sit that step's rejected drafts before the host's (empty: none)
    shift_from: list[int] = field(default_factory=list)
    # SamplingParams.prompt_logprobs: token rows whose logits score the prompt's next token (prompt_targets),
    # with the top prompt_tops[i] others; prompt_owners: each one's sequence (its batch row)
    prompt_rows: list[int] = field(default_factory=list)
    prompt_targets: list[int] = field(default_factory=list)
    prompt_tops: list[int] = field(default_factory=list)
    prompt_owners: list[int] = field(default_factory=list)


@dataclass(slots=True)
class DraftInputs:
    """One forward of the speculative draft. Row r reads hidden state hidden_rows[r] of the target's last
    forward (from="target") or of the draft's last logits rows (from="draft": chained drafting)."""

    ids: list[int]
    positions: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    hidden_rows: list[int]
    source: str  # "target" or "draft"
    logit_rows: list[int]
    # fed on the device: rows fed_rows take the source's tokens at its logits rows fed_from (a chained
    # forward: the draft's argmax; a catch-up: the target's draws); their ids here are placeholders
    fed_rows: list[int] = field(default_factory=list)
    fed_from: list[int] = field(default_factory=list)
    # rows that follow a verify step launched ahead (execution/ahead_rows.py): a catch-up (source
    # "target") sits that step's lag before the host's positions; a chained forward sits its source's
    # lag and the verify's rejected drafts before them, its first reading rows rejected drafts earlier
    ahead: bool = False


def prepare_step(batch: ScheduledBatch) -> StepInputs:
    """The forward inputs of a scheduled batch: its sequences' new tokens (those still on the device as
    placeholders, then its drafts), positions, block tables and state slots."""
    inputs = StepInputs([], [], [], [], [], [], [], [], [], [])
    drafts = batch.drafts or [[]] * len(batch.seqs)
    for row, (seq, n, draft) in enumerate(zip(batch.seqs, batch.num_new_tokens, drafts, strict=True)):
        start, known = seq.num_computed_tokens, n - len(draft)
        if seq.scores_prompt:
            _score_prompt(inputs, row, seq, start, known)
        ids = seq.token_ids[start : start + known]  # short by the tokens still on the device
        inputs.ids += ids + [0] * (known - len(ids)) + draft
        inputs.positions += range(start, start + n)
        inputs.query_lens.append(n)
        inputs.seq_lens.append(start + n)
        inputs.block_tables.append(list(seq.block_table))
        inputs.state_slots.append(seq.state_slot)
        inputs.fresh.append(start == 0)
        if draft and seq.state_slot >= 0:
            inputs.step_slots += [seq.state_slot, *seq.spare_state_slots][:n]
        if start + known == seq.num_tokens:
            inputs.ends.append(row)
            last = len(inputs.ids) - len(draft) - 1
            inputs.logit_rows += range(last, last + len(draft) + 1)
    inputs.state_copies = [(snapshot, seq.state_slot) for seq, snapshot in batch.restores]
    rows = {id(seq): row for row, seq in enumerate(batch.seqs)}
    for save in batch.saves:
        row = rows[id(save.seq)]
        if save.upto == batch.num_new_tokens[row]:  # its slot holds it after the forward: copied then
            inputs.state_saves.append((save.seq.state_slot, save.slot))
            continue
        if not inputs.snapshot_slots:
            inputs.snapshot_slots, inputs.snapshot_lens = [-1] * len(batch.seqs), [0] * len(batch.seqs)
        inputs.snapshot_slots[row], inputs.snapshot_lens[row] = save.slot, save.upto
    return inputs


def _score_prompt(inputs: StepInputs, row: int, seq: Sequence, start: int, known: int) -> None:
    """The rows of seq's chunk (positions start..start+known-1) whose logits give the logprob of a prompt
    token not yet scored: position p scores token p + 1."""
    prompt, first = seq.prompt_token_ids, len(seq.prompt_logprobs) - 1  # (position 0 has no score)
    base = len(inputs.ids) - start  # the chunk's row of position p is base + p
    for p in range(max(start, first), min(start + known, len(prompt) - 1)):
        inputs.prompt_rows.append(base + p)
        inputs.prompt_targets.append(prompt[p + 1])
        inputs.prompt_tops.append(seq.params.prompt_logprobs)
        inputs.prompt_owners.append(row)


def feed_sampled(ids: torch.Tensor, rows: list[int], sources: list[int], sampled: torch.Tensor) -> None:
    """ids[rows] = sampled[sources], on the device: the tokens of the last step, never read by the host.

    ids: [T] int64 token ids of this step; sampled: [R] int64, the last step's argmax per logits row."""
    n = len(rows)
    if rows == list(range(n)) and sources == list(range(n)):  # nothing finished since: one copy
        ids[:n].copy_(sampled[:n])
        return
    # one copy (through pinned memory: a pageable one would wait for the step in flight)
    index = to_device([rows, sources], torch.long, ids.device)
    ids[index[0]] = sampled[index[1]]
