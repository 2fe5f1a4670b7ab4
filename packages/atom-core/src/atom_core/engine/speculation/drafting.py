"""Proposing speculative tokens after a verified step: the draft catches up on the step's valid rows, then
chains its own guesses.

The draft's row at position i reads the target's hidden state h_i and the token after it, t_{i+1}; its
cache rows live in the same blocks as the target's rows of those positions. After each target forward,
every row whose target KV is now valid (a prefill chunk, or a decode's last token and accepted drafts)
gets its draft row, so the draft's cache always covers what the target's does (a preempted sequence
recomputes both; a prefix-cache hit finds both). The rows of rejected drafts are overwritten by the next
catch-up before anything reads them (attention reads positions below the query only).

A sequence that reached its last known token then proposes: the catch-up's last row drafts token 1, and
token j + 1 comes from the draft applied to its own token j and hidden state, one row per sequence. The
KV blocks of those chained rows come from the scheduler, as every other block does.

When the verify step drew its rows in its forward, the catch-up is launched before the host reads them
(catch_up): its rows are fed the target's draws on the device, so it runs while the host verifies and
emits; then only the chain waits for the acceptance.

A proposal is the draft's argmax. Each chained forward takes the proposals of the one before it on the
device (DraftInputs.fed_rows): the chain's shape (who drafts how many tokens, and their blocks) is known
on the host without the tokens. The proposals stay on the device (pending_proposals.py): the next verify
step's draft rows take them there, and the host reads them once, after launching that step.

An oracle, when given, chooses the proposals instead: oracle(seq, j, token) -> the token proposed as
seq's draft j (0-based) where the draft's own guess was `token`. Its choice is fed from the host, so each
chained forward waits for the read of the one before it. Tests force proposals with it (always right,
always wrong, right for the first j) to check acceptance and rollback exactly; the identity oracle
proposes what the device-fed chain proposes. Verifies launched ahead (steps/speculative_ahead.py) are
forced on the device instead (ahead_oracle): ahead_oracle(seqs, j, positions, tokens) -> [S] int64, the
tokens proposed as draft j of seqs where the draft guessed tokens [S], at output positions [S] (on the
device: they follow acceptances the host has not read). One process only: tensor-parallel workers would
chain their own guesses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from atom_core.engine.execution.ahead_rows import ahead_tokens
from atom_core.engine.execution.runner import DraftResult, Runner, StepResult
from atom_core.engine.execution.step_inputs import DraftInputs, StepInputs
from atom_core.engine.plan import CachePlan
from atom_core.engine.scheduling.scheduler import ScheduledBatch, Scheduler
from atom_core.engine.scheduling.sequence import Sequence, Status
from atom_core.engine.speculation.pending_proposals import PendingProposals
from atom_core.engine.speculation.prefill_drafts import PrefillPart, draft_prefills
from atom_core.host_copy import host_to_device

Oracle = Callable[[Sequence, int, int], int]
AheadOracle = Callable[[list[Sequence], int, torch.Tensor, torch.Tensor], torch.Tensor]


class Drafter:
    def __init__(self, runner: Runner, scheduler: Scheduler, plan: CachePlan, oracle: Oracle | None = None):
        self.runner, self.scheduler, self.oracle = runner, scheduler, oracle
        self.ahead_oracle: AheadOracle | None = None  # (tests: forced proposals of verifies launched ahead)
        self.k, self.max_model_len = plan.num_speculative_tokens, plan.max_model_len
        self.pending: PendingProposals | None = None  # the last chain's proposals, not read yet

    def feed(self, batch: ScheduledBatch, inputs: StepInputs) -> torch.Tensor | None:
        """Before a target step is launched: its draft rows take the pending proposals on the device
        (inputs.fed_rows); returns the tokens they are fed from, or None."""
        return None if self.pending is None else self.pending.feed(batch, inputs)

    def resolve(self, batch: ScheduledBatch) -> None:
        """After a target step was launched (or failed to be): the pending proposals are read into the
        sequences' and the batch's drafts. Every target step ends what was pending: the next one feeds on
        the draft forwards after it."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.resolve(batch)

    @property
    def forced_on_device(self) -> bool:
        """Whether a verify can launch ahead: no oracle forces proposals, or one does on the device too."""
        return self.oracle is None or self.ahead_oracle is not None

    def _choose(self, seq: Sequence, token: int) -> int:
        j = len(seq.draft_token_ids)
        return token if self.oracle is None else self.oracle(seq, j, token)

    def wanted(self, seq: Sequence) -> int:
        """How many tokens to draft for seq now: none for penalized requests (their penalties would depend
        on the drafts) and none past max_tokens or max_model_len."""
        if seq.params.penalized or seq.num_uncomputed != 1:
            return 0
        left = min(seq.params.max_tokens - len(seq.output_token_ids), self.max_model_len - len(seq.token_ids))
        return max(0, min(self.k, left))

    @torch.inference_mode()
    def catch_up(self, batch: ScheduledBatch, inputs: StepInputs, result: StepResult) -> DraftResult | None:
        """Before the host reads the step: when every sequence verifies k drafts and the forward drew its
        rows (result.tokens), the catch-up over all k + 1 rows of each, fed the target's draws on the
        device. Row j's token is the draw at row j, which is the sequence's token at that position for
        every row up to the first rejected draft; later rows are overwritten before anything reads them.
        None where it waits for the read (propose then catches up on the valid rows); always None with an
        oracle, whose chain is fed from the host."""
        if self.oracle is not None or result.tokens is None or not self._uniform(batch):
            return None
        q = self.k + 1
        step = DraftInputs([], [], [], [], [], [], "target", [])
        for i, seq in enumerate(batch.seqs):
            first, start = i * q, inputs.positions[i * q]
            step.ids += [0] * q
            step.positions += range(start, start + q)
            step.hidden_rows += range(first, first + q)
            step.query_lens.append(q)
            step.seq_lens.append(start + q)
            step.block_tables.append(list(seq.block_table))
        step.logit_rows = step.fed_rows = step.fed_from = list(range(len(step.ids)))
        return self.runner.run_draft(step, result)

    @torch.inference_mode()
    def launch_ahead(
        self,
        batch: ScheduledBatch,
        inputs: StepInputs,
        result: StepResult,
        prefills: PrefillPart | None = None,
    ) -> None:
        """After a verify launched ahead (steps/speculative_ahead.py), before anything is read: the
        catch-up over every sequence's k + 1 rows, then the chained forwards after its accepted drafts,
        all placed on the device (execution/ahead_rows.py). The next verify's tokens are left pending
        (self.pending, in ahead_tokens' layout: the bonus token, then the k drafts), followed by those of
        the prefills launched beside it (speculation/prefill_drafts.py)."""
        q, n = self.k + 1, len(batch.seqs)
        rows = list(range(n * q))
        catch_up = DraftInputs(
            [0] * (n * q),
            inputs.positions,
            [q] * n,
            inputs.seq_lens,
            inputs.block_tables,
            rows,
            "target",
            rows,
            fed_rows=rows,
            fed_from=rows,
            ahead=True,
        )
        drafts = [self.runner.run_draft(catch_up, result)]
        if self.ahead_oracle is not None:  # each proposal's output position, on the device
            # (a pinned copy: a plain one waits for the verify just launched, and the chain's launches
            # and the host's read of the step before would no longer overlap the device's work)
            positions = host_to_device(
                torch.tensor([len(s.output_token_ids) + s.num_pending + q for s in batch.seqs]),
                result.accepted.device,
            )
            positions -= result.chain_shift
            self._force_ahead(batch.seqs, 0, positions, drafts[0], result.accepted)
        for j in range(1, self.k):
            chain = DraftInputs([0] * n, [], [1] * n, [], [], [], "draft", list(range(n)), ahead=True)
            for i, seq in enumerate(batch.seqs):
                # as the host assumes: every draft accepted, so the draft's row of token j is q + j - 1
                # past the verify's first (the device moves it back by what was rejected)
                position = inputs.positions[i * q] + q + j - 1
                if not self.scheduler.grant_draft_rows(seq, q + j):
                    raise RuntimeError("a chain launched ahead found no KV block for its row")
                chain.positions.append(position)
                chain.seq_lens.append(position + 1)
                chain.block_tables.append(list(seq.block_table))
                # the first reads the catch-up's row of the last draft (moved back to the last accepted)
                chain.hidden_rows.append(i * q + self.k if j == 1 else i)
            chain.fed_rows, chain.fed_from = list(range(n)), list(chain.hidden_rows)
            drafts.append(self.runner.run_draft(chain, drafts[-1]))
            if self.ahead_oracle is not None:
                self._force_ahead(batch.seqs, j, positions + j, drafts[-1])
        where = [(seq, list(range(i * q + 1, i * q + q))) for i, seq in enumerate(batch.seqs)]
        tokens = ahead_tokens(result, drafts)
        if prefills is not None:  # beside it: the prefills' draft rows and chains, after its sequences
            more, also = draft_prefills(
                self.runner, self.scheduler, prefills, self.k, self.max_model_len, n * q
            )
            tokens, where = torch.cat([tokens, more]), where + also
        self.pending = PendingProposals.start(tokens, where, source="ahead")

    def _force_ahead(self, seqs, j: int, positions, drafted: DraftResult, accepted=None) -> None:
        """The ahead oracle's draft j in place of the draft's own (a catch-up's: at each sequence's last
        accepted row), so the chain and the next verify take it."""
        tokens = drafted.tokens.view(len(seqs), -1)
        at = accepted[:, None] if accepted is not None else torch.zeros_like(tokens[:, :1])
        forced = self.ahead_oracle(seqs, j, positions, tokens.gather(1, at)[:, 0])
        tokens.scatter_(1, at, forced[:, None])

    def _uniform(self, batch: ScheduledBatch) -> bool:
        """Every sequence verifies k drafts and runs on: the catch-up covers all k + 1 rows of each (the
        rejected ones too, overwritten later as the target's are), one shape a step, which a CUDA graph
        replays."""
        return all(
            len(d) == self.k and s.status is Status.RUNNING
            for s, d in zip(batch.seqs, batch.drafts, strict=True)
        )

    @torch.inference_mode()
    def propose(
        self,
        batch: ScheduledBatch,
        inputs: StepInputs,
        result: StepResult,
        caught_up: DraftResult | None = None,
    ) -> None:
        """After the step's tokens were accepted: write the draft rows of every running sequence's valid rows
        (unless catch_up did, before the read: caught_up) and set draft_token_ids of those that propose."""
        # Otherwise the catch-up covers all rows when uniform, else exactly the valid rows.
        uniform = caught_up is not None or self._uniform(batch)
        step = DraftInputs([], [], [], [], [], [], "target", [])
        proposing: list[tuple[Sequence, int]] = []
        picks = []  # the catch-up row whose logits draft each proposing sequence's first token
        row0 = 0
        for seq, q_len in zip(batch.seqs, inputs.query_lens, strict=True):
            first, row0 = row0, row0 + q_len
            if seq.status is not Status.RUNNING:
                continue
            start = inputs.positions[first]
            valid = seq.num_computed_tokens - start  # rows of this step whose target KV stands
            seq.draft_token_ids = []
            if caught_up is None:
                n = q_len if uniform else valid
                step.ids += seq.token_ids[start + 1 : start + valid + 1] + [0] * (n - valid)
                step.positions += range(start, start + n)
                step.hidden_rows += range(first, first + n)
                step.query_lens.append(n)
                step.seq_lens.append(start + n)
                step.block_tables.append(list(seq.block_table))
            if (k := self.wanted(seq)) > 0:
                # (the caught-up rows are the step's own: each sequence's from its first)
                picks.append(first + valid - 1 if caught_up is not None else len(step.ids) - n + valid - 1)
                proposing.append((seq, k))
        if caught_up is None:
            if not step.ids:
                return
            step.logit_rows = list(range(len(step.ids))) if uniform else picks
            drafted = self.runner.run_draft(step, result)
        else:
            drafted = caught_up
        if not proposing:
            return
        rows = picks if uniform else list(range(len(picks)))  # where each proposer's row is in the logits
        if self.oracle is None:
            self._chain_on_device(proposing, rows, drafted)
        else:
            self._chain_from_host(proposing, rows, drafted)

    def _chained(self, proposing: list[tuple[Sequence, int]], rows: list[int], j: int, last: list[int]):
        """Chained forward j's inputs (one row per sequence still drafting, each fed its draft j - 1: from
        last, or placeholders where last is None), and those sequences with their rows in its logits."""
        chain = DraftInputs([], [], [], [], [], [], "draft", [])
        going = []
        for row, (seq, k), token in zip(rows, proposing, last, strict=True):
            position = seq.num_computed_tokens + j - 1  # its token j's draft row
            if k <= j or not self.scheduler.grant_draft_rows(seq, j):
                continue
            chain.ids.append(token)
            chain.positions.append(position)
            chain.hidden_rows.append(row)
            chain.query_lens.append(1)
            chain.seq_lens.append(position + 1)
            chain.block_tables.append(list(seq.block_table))
            chain.logit_rows.append(len(going))
            chain.fed_rows.append(len(going))
            chain.fed_from.append(row)
            going.append((seq, k))
        return chain, going

    def _chain_on_device(self, proposing, rows: list[int], drafted) -> None:
        """Every chained forward fed on the device; the proposals left pending there (self.pending), in the
        concatenation of every draft forward's tokens since the target step."""
        tokens, offset = [drafted.tokens], drafted.tokens.shape[0]
        index = {id(seq): [row] for (seq, _), row in zip(proposing, rows, strict=True)}
        everyone = [seq for seq, _ in proposing]
        for j in range(1, self.k):
            chain, going = self._chained(proposing, rows, j, [0] * len(proposing))
            if not going:
                break
            drafted = self.runner.run_draft(chain, drafted)
            for i, (seq, _) in enumerate(going):
                index[id(seq)].append(offset + i)
            tokens.append(drafted.tokens)
            offset += drafted.tokens.shape[0]
            proposing, rows = going, list(range(len(going)))
        where = [(seq, index[id(seq)]) for seq in everyone]
        self.pending = PendingProposals.start(torch.cat(tokens), where)

    def _chain_from_host(self, proposing, rows: list[int], drafted) -> None:
        """The oracle's proposals, each chained forward fed from the host after reading the one before."""
        tokens = drafted.tokens[torch.tensor(rows, dtype=torch.long, device=drafted.tokens.device)].tolist()
        for j in range(self.k):
            for (seq, _), token in zip(proposing, tokens, strict=True):
                seq.draft_token_ids.append(self._choose(seq, token))
            if j + 1 == self.k:
                return
            chain, going = self._chained(
                proposing, rows, j + 1, [s.draft_token_ids[-1] for s, _ in proposing]
            )
            if not going:
                return
            chain.fed_rows, chain.fed_from = [], []
            drafted = self.runner.run_draft(chain, drafted)
            tokens = drafted.tokens.tolist()
            proposing, rows = going, list(range(len(going)))
