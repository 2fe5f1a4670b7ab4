"""Sampling penalties on a logits row, against vLLM's formulas computed here by hand: frequency counts every
output occurrence, presence each output token once, repetition divides positive and multiplies negative
logits of every token seen (prompt and output)."""

import pytest
import torch

from atom_core.engine import SamplingParams
from atom_core.engine.sampling.penalties import apply_penalties
from atom_core.engine.scheduling.sequence import Sequence

PROMPT, OUTPUT = [5, 6], [1, 1, 1, 2]  # token 1 thrice, token 2 once, 5 and 6 only in the prompt


def _row(**params) -> torch.Tensor:
    seq = Sequence("r", 0, list(PROMPT), SamplingParams(**params))
    for token in OUTPUT:
        seq.append(token, None)
    row = torch.tensor([2.0, 3.0, -1.0, 0.5, 4.0, 1.5, -2.0, 0.25])
    apply_penalties(row, seq)
    return row


@pytest.mark.parametrize(("presence", "frequency"), [(0.5, 0.0), (0.0, 0.25), (0.5, 0.25), (-0.3, 0.1)])
def test_presence_counts_a_token_once_and_frequency_each_time(presence, frequency):
    got = _row(presence_penalty=presence, frequency_penalty=frequency)
    want = torch.tensor([2.0, 3.0, -1.0, 0.5, 4.0, 1.5, -2.0, 0.25])
    want[1] -= 3 * frequency + presence
    want[2] -= 1 * frequency + presence
    torch.testing.assert_close(got, want)


def test_repetition_divides_positive_and_multiplies_negative_seen_logits_then_shifts_to_zero():
    got = _row(repetition_penalty=2.0)
    want = torch.tensor([2.0, 1.5, -2.0, 0.5, 4.0, 0.75, -4.0, 0.25])  # seen: 1, 2 (output), 5, 6 (prompt)
    torch.testing.assert_close(got, want - want.max())
