"""The draft's rows and proposals of prefill chunks that ran beside a verify launched ahead.

A request admitted while a verify is in flight prefills in its own forward, launched with that verify
(steps/speculative_ahead.py): its first token is drawn on the device and read by the host one step
later, with the verify. Its draft rows and its first proposals cannot wait for that read, or the next
verify, which the new sequence joins, would: the draft catches up on the chunk's rows (row p reads the
target's hidden state at p and token p + 1: the prompt's, or for a final chunk's last row the draw), and
a final chunk's sequence then chains its k drafts on the device, as a verify's chain does. The next
verify takes the draw and the drafts in ahead_tokens' layout (the bonus token, then the k drafts), with
no rows to move back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.engine.execution.runner import Runner, StepResult
from atom_core.engine.execution.step_inputs import DraftInputs, StepInputs
from atom_core.engine.scheduling.scheduler import ScheduledBatch, Scheduler
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.host_copy import row_index


@dataclass(slots=True)
class PrefillPart:
    """Prefill chunks launched beside a verify ahead: their batch, inputs and forward's results (one
    logits row, drawn on the device, per sequence whose chunk is its last: inputs.ends)."""

    batch: ScheduledBatch
    inputs: StepInputs
    result: StepResult

    @property
    def drawn(self) -> list[Sequence]:
        """The sequences whose first token (of this prefill) was drawn, in the result's row order."""
        return [self.batch.seqs[i] for i in self.inputs.ends]


def wanted_after_draw(seq: Sequence, k: int, max_model_len: int) -> int:
    """Drafts seq proposes once its drawn token is appended (Drafter.wanted, a token early)."""
    left = min(seq.params.max_tokens - len(seq.output_token_ids), max_model_len - len(seq.token_ids)) - 1
    return 0 if seq.params.penalized else max(0, min(k, left))


@torch.inference_mode()
def draft_prefills(
    runner: Runner, scheduler: Scheduler, part: PrefillPart, k: int, max_model_len: int, base: int
) -> tuple[torch.Tensor, list[tuple[Sequence, list[int]]]]:
    """Launch the draft's catch-up over every prefill row and the chains of the drawn sequences.
    Returns [D * (k + 1)] int64, per drawn sequence its draw then its k draft slots (0 where it proposes
    fewer), and each drawn sequence's draft positions in them offset by base (PendingProposals.start)."""
    batch, inputs, result = part.batch, part.inputs, part.result
    catch_up = DraftInputs([], [], [], [], [], [], "target", [])
    ends, drawn = set(inputs.ends), []  # drawn: (sequence, its chunk's end, drafts it wants)
    row = 0
    for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
        start = inputs.positions[row]
        known = seq.token_ids[start + 1 : start + n + 1]  # a final chunk's last token follows: the draw
        catch_up.ids += known + [0] * (n - len(known))
        catch_up.positions += range(start, start + n)
        catch_up.query_lens.append(n)
        catch_up.seq_lens.append(start + n)
        catch_up.block_tables.append(list(seq.block_table))
        catch_up.hidden_rows += range(row, row + n)
        if i in ends:
            catch_up.logit_rows.append(row + n - 1)
            catch_up.fed_rows.append(row + n - 1)
            catch_up.fed_from.append(len(drawn))  # the draw's logits row in the prefill's result
            drawn.append((seq, start + n, wanted_after_draw(seq, k, max_model_len)))
        row += n
    proposed = runner.run_draft(catch_up, result)
    q = k + 1
    columns = torch.zeros(len(drawn), q, dtype=torch.int64, device=result.tokens.device)
    columns[:, 0] = result.tokens[0]
    columns[:, 1] = proposed.tokens
    counts = [min(w, 1) for _, _, w in drawn]
    going = [(i, i) for i, (_, _, w) in enumerate(drawn) if w > 1]  # (sequence, its row in `proposed`)
    for j in range(1, k):
        chain = DraftInputs([], [], [], [], [], [], "draft", [])
        kept = []
        for i, r in going:
            seq, end, w = drawn[i]
            # draft j + 1 comes from the draft's row at end + j - 1, fed draft j (the row before's)
            if w <= j or not scheduler.grant_draft_rows(seq, end - seq.num_computed_tokens + j):
                continue
            chain.ids.append(0)
            chain.positions.append(end + j - 1)
            chain.query_lens.append(1)
            chain.seq_lens.append(end + j)
            chain.block_tables.append(list(seq.block_table))
            chain.hidden_rows.append(r)
            chain.logit_rows.append(len(kept))
            chain.fed_rows.append(len(kept))
            chain.fed_from.append(r)
            kept.append(i)
        if not kept:
            break
        proposed = runner.run_draft(chain, proposed)
        # (an index built on the host and copied without waiting: a pageable copy would wait for the
        # verify and prefills queued before it)
        columns[row_index(kept, columns.device, len(drawn)), j + 1] = proposed.tokens
        for i in kept:
            counts[i] += 1
        going = [(i, r) for r, i in enumerate(kept)]
    where = [(seq, [base + i * q + 1 + j for j in range(counts[i])]) for i, (seq, _, _) in enumerate(drawn)]
    return columns.view(-1), where
