"""greedy_tokens: each row's first maximum and its finiteness, in one launch, against torch's argmax and
isfinite (CPU: Triton's interpreter; GPU: the kernel)."""

import pytest
import torch

from atom_kernels.sampling import greedy_tokens, greedy_tokens_ref
from atom_kernels.sampling.greedy import CHUNK

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "vocab"), [(1, 1000), (3, 2 * CHUNK + 517), (5, 77)])
def test_random_rows_equal_torch(rows, vocab, dtype):
    logits = (torch.randn(rows, vocab, device=DEVICE) * 4).to(dtype)
    got = greedy_tokens(logits, backend="triton")
    assert got.dtype == torch.int64 and got.shape == (2, rows)
    assert torch.equal(got, greedy_tokens_ref(logits))
    assert torch.equal(greedy_tokens(logits, backend="triton"), got)  # the tickets were left at zero


def test_ties_give_the_first_index_within_a_step_across_steps_and_across_chunks():
    vocab = 3 * CHUNK
    logits = torch.zeros(4, vocab, device=DEVICE)
    for row, places in enumerate(
        [(5, 9), (100, 2100), (CHUNK - 1, CHUNK, 2 * CHUNK + 3), (2 * CHUNK + 1, 2 * CHUNK + 2)]
    ):
        logits[row, list(places)] = 7.0
    got = greedy_tokens(logits, backend="triton")
    assert got[0].tolist() == [5, 100, CHUNK - 1, 2 * CHUNK + 1]
    assert torch.equal(got, greedy_tokens_ref(logits))


def test_rows_with_nan_or_infinities_are_marked_and_the_others_are_not_disturbed():
    vocab = CHUNK + 300
    logits = torch.randn(6, vocab, device=DEVICE)
    logits[1, CHUNK + 7] = float("nan")
    logits[2, 3] = float("inf")
    logits[3, 11] = float("-inf")
    logits[4] = float("-inf")
    got = greedy_tokens(logits, backend="triton")
    want = greedy_tokens_ref(logits)
    assert got[1].tolist() == [1, 0, 0, 0, 0, 1]
    for row in (0, 5):
        assert got[0, row] == want[0, row]


def test_a_strided_view_and_an_empty_batch():
    wide = torch.randn(3, 900, device=DEVICE)
    view = wide[:, :700]  # rows 900 apart
    assert torch.equal(greedy_tokens(view, backend="triton"), greedy_tokens_ref(view))
    assert greedy_tokens(torch.empty(0, 50, device=DEVICE), backend="triton").shape == (2, 0)
    close = torch.tensor([[1.0, 1.0 + 1e-12]], dtype=torch.float64, device=DEVICE)  # equal in fp32
    assert greedy_tokens(close, backend="triton")[0].item() == 1  # fp64 keeps torch's comparison
    with pytest.raises(ValueError, match=r"logits \[B, V\]"):
        greedy_tokens(torch.zeros(10, device=DEVICE))
