"""Speculative acceptance on the device: how many of each sequence's drafts the target's draws accept,
in one launch.

A verify step gives each sequence q rows: its last known token, then its q - 1 drafts. The target's draw
at row j is its token at draft j + 1's position, so draft j + 1 is accepted while it equals that draw and
every draft before it was. An engine that launches the next step before reading this one needs the
count on the device (and the drafts it rejected: how far the next step's rows sit back), and the draft
forwards chained after it where its last accepted row is and how far their rows sit back; torch takes
several small kernels for these (accepted_drafts_ref), this one program a sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.settings import Backend, resolve_backend


def accepted_drafts_ref(
    draws: torch.Tensor, ids: torch.Tensor, q: int, shift: torch.Tensor | None = None
) -> torch.Tensor:
    """draws, ids: [S * q] int64, each sequence's rows' draws and input tokens; shift: [S] int64, how far
    its rows already sat back (None: 0) -> [4, S] int64: row 0 the drafts accepted (leading j with
    ids[s * q + j + 1] == draws[s * q + j]), row 1 those rejected, row 2 the flat index of its last
    accepted row (s * q + accepted), row 3 shift + rejected (how far rows after them sit back)."""
    drawn, fed = draws.view(-1, q), ids.view(-1, q)
    accepted = (drawn[:, :-1] == fed[:, 1:]).long().cumprod(dim=1).sum(dim=1)
    rejected = (q - 1) - accepted
    first = torch.arange(accepted.shape[0], device=draws.device) * q
    return torch.stack([accepted, rejected, first + accepted, rejected + (0 if shift is None else shift)])


@triton.jit
def _accept_kernel(
    draws_ptr, ids_ptr, shift_ptr, out_ptr, s_total, q, HAS_SHIFT: tl.constexpr, BLOCK_Q: tl.constexpr
):
    s = tl.program_id(0)
    j = tl.arange(0, BLOCK_Q)
    mask = j < q - 1
    drawn = tl.load(draws_ptr + s * q + j, mask=mask, other=0)
    fed = tl.load(ids_ptr + s * q + 1 + j, mask=mask, other=1)
    # the first draft that differs (q - 1 when none does)
    first = tl.min(tl.where(mask & (drawn != fed), j, q - 1), axis=0).to(tl.int64)
    rejected = q - 1 - first
    shift = tl.load(shift_ptr + s) if HAS_SHIFT else 0
    tl.store(out_ptr + s, first)
    tl.store(out_ptr + s_total + s, rejected)
    tl.store(out_ptr + 2 * s_total + s, s * q + first)
    tl.store(out_ptr + 3 * s_total + s, rejected + shift)


def accepted_drafts(
    draws: torch.Tensor,
    ids: torch.Tensor,
    q: int,
    shift: torch.Tensor | None = None,
    *,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """accepted_drafts_ref in one launch (a GPU, or backend="triton" under the CPU interpreter; else
    torch). draws, ids and shift contiguous int64."""
    s = draws.shape[0] // q
    use_kernel = (
        resolve_backend(backend, draws.device) is not Backend.TORCH
        and (draws.is_cuda or backend is not None)
        and s > 0
        and q > 1
        and draws.dtype == ids.dtype == torch.int64
        and draws.is_contiguous()
        and ids.is_contiguous()
        and (shift is None or (shift.dtype == torch.int64 and shift.is_contiguous()))
    )
    if not use_kernel:
        return accepted_drafts_ref(draws, ids, q, shift)
    out = torch.empty(4, s, dtype=torch.int64, device=draws.device)
    has_shift = shift is not None
    _accept_kernel[(s,)](
        draws, ids, shift if has_shift else out, out, s, q, HAS_SHIFT=has_shift,
        BLOCK_Q=triton.next_power_of_2(q),
    )  # fmt: skip
    return out
