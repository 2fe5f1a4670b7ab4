"""move_rows_back: a batch's rows moved back by a per-sequence lag (positions, sequence lengths, cache
slots) in one launch, against its torch path and against slots computed on the host (CPU: Triton's
interpreter; GPU: the kernel)."""

import pytest
import torch

from atom_kernels.cache import move_rows_back

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def batch(seqs: int, q: int, block_size: int, pages: int, gen: torch.Generator):
    """Rows placed as if nothing was rejected: each sequence's q rows end at its length; padded rows and
    sequences past the first `seqs` (a captured graph's) must be left alone."""
    starts = torch.randint(q, pages * block_size - q, (seqs,), generator=gen)
    positions = torch.cat(
        [torch.arange(s, s + q) for s in starts.tolist()] + [torch.zeros(q, dtype=torch.long)]
    )
    seq_lens = torch.cat([starts + q, torch.tensor([q])]).int()
    tables = torch.randperm(4 * pages * (seqs + 1), generator=gen)[: (seqs + 1) * pages].view(-1, pages).int()
    slots = torch.full(((seqs + 1) * q,), -1, dtype=torch.long)
    lag = torch.randint(0, q, (seqs,), generator=gen)
    return [t.to(DEVICE) for t in (positions, seq_lens, slots, tables, lag)]


@pytest.mark.parametrize(("seqs", "q", "block_size"), [(1, 2, 16), (5, 3, 4), (7, 5, 1), (3, 1, 8)])
def test_rows_move_back_as_the_reference_and_the_host_say(seqs, q, block_size):
    gen = torch.Generator().manual_seed(seqs * 10 + q)
    want = batch(seqs, q, block_size, -(-3 * q // block_size) + 2, gen)
    got = [t.clone() for t in want]
    move_rows_back(*want, q, block_size, backend="torch")
    move_rows_back(*got, q, block_size, backend="triton")
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)
    positions, seq_lens, slots, tables, _ = (t.cpu() for t in got)
    for s in range(seqs):
        rows = range(s * q, s * q + q)
        assert positions[rows.start : rows.stop].tolist() == list(range(seq_lens[s] - q, seq_lens[s]))
        assert [slots[r].item() for r in rows] == [
            tables[s, p // block_size].item() * block_size + p % block_size
            for p in positions[rows.start : rows.stop].tolist()
        ]
    assert slots[seqs * q :].eq(-1).all() and seq_lens[seqs] == q  # the padding past them is untouched


def test_strided_block_table_rows():
    """A captured graph's block tables are rows of max_pages of a larger buffer: only the used columns."""
    gen = torch.Generator().manual_seed(1)
    positions, seq_lens, slots, tables, lag = batch(4, 3, 4, 6, gen)
    wide = torch.zeros(tables.shape[0], 10, dtype=torch.int32, device=DEVICE)
    wide[:, :6] = tables
    want = [t.clone() for t in (positions, seq_lens, slots)]
    move_rows_back(*want, tables, lag, 3, 4, backend="torch")
    move_rows_back(positions, seq_lens, slots, wide[:, :6], lag, 3, 4, backend="triton")
    assert all(torch.equal(w, g) for w, g in zip(want, (positions, seq_lens, slots), strict=True))
