"""accepted_drafts: each sequence's accepted and rejected drafts from its rows' draws and input tokens,
its last accepted row and the shift of the rows after it, in one launch, against its torch reference and against the count written out by hand (CPU: Triton's
interpreter; GPU: the kernel)."""

import pytest
import torch

from atom_kernels.sampling import accepted_drafts, accepted_drafts_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("q", [2, 3, 5, 9])
def test_every_acceptance_count_is_found(q):
    """Sequence s's drafts equal the draws for its first s % q of them, then one differs (and the rest
    may match again: only the leading run counts)."""
    seqs = 3 * q
    gen = torch.Generator().manual_seed(q)
    draws = torch.randint(0, 1000, (seqs, q), generator=gen)
    ids = torch.randint(0, 1000, (seqs, q), generator=gen)
    want = []
    for s in range(seqs):
        right = s % q
        ids[s, 1 : 1 + right] = draws[s, :right]
        if right < q - 1:
            ids[s, 1 + right] = draws[s, right] + 1
            ids[s, 2 + right :] = draws[s, 1 + right : q - 1]  # later matches do not count
        want.append(right)
    draws, ids = draws.view(-1).to(DEVICE), ids.view(-1).to(DEVICE)
    rejected = [q - 1 - w for w in want]
    last_rows = [s * q + w for s, w in enumerate(want)]
    got = accepted_drafts(draws, ids, q, backend="triton")
    assert got.tolist() == [want, rejected, last_rows, rejected]
    assert torch.equal(got, accepted_drafts_ref(draws, ids, q))
    shift = torch.arange(seqs, dtype=torch.int64, device=DEVICE) % 3
    got = accepted_drafts(draws, ids, q, shift, backend="triton")
    assert got[3].tolist() == [r + s % 3 for s, r in enumerate(rejected)]
    assert torch.equal(got, accepted_drafts_ref(draws, ids, q, shift))
