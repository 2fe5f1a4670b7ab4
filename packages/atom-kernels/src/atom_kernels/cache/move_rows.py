"""Move a batch's new rows back by a per-sequence count, on the device: positions, sequence lengths and
the cache slots they address, in one launch.

A speculative engine that launches a verify before it has read how many drafts the one before accepted
prepares its rows as if all were, then moves each sequence's rows back by the drafts that were rejected
(a count on the device). In torch that is about ten small kernels a forward (move_rows_back's torch
path); here one program a sequence does all of it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _move_rows_kernel(
    positions_ptr,
    seq_lens_ptr,
    slots_ptr,
    tables_ptr,
    lag_ptr,
    table_stride,
    q,
    block_size,
    BLOCK_Q: tl.constexpr,
):
    s = tl.program_id(0)
    lag = tl.load(lag_ptr + s)
    tl.store(seq_lens_ptr + s, tl.load(seq_lens_ptr + s) - lag.to(tl.int32))
    rows = tl.arange(0, BLOCK_Q)
    mask = rows < q
    position = tl.load(positions_ptr + s * q + rows, mask=mask) - lag
    tl.store(positions_ptr + s * q + rows, position, mask=mask)
    page = tl.load(tables_ptr + s * table_stride + position // block_size, mask=mask).to(tl.int64)
    tl.store(slots_ptr + s * q + rows, page * block_size + position % block_size, mask=mask)


def move_rows_back(
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    lag: torch.Tensor,
    q: int,
    block_size: int,
    *,
    backend: Backend | str | None = None,
) -> None:
    """In place, for S = len(lag) sequences of q rows each (the first S * q rows, the first S sequences):
    positions [>= S * q] int64 and seq_lens [>= S] int32 drop by each sequence's lag [S] int64, and slots
    [>= S * q] int64 become the moved positions' cache slots in block_tables [>= S, P] int32
    (block_tables[s][p // block_size] * block_size + p % block_size).

    Every tensor contiguous but block_tables, whose rows may be strided. The kernel runs on a GPU, or with
    backend="triton" under the CPU interpreter; otherwise the torch path (the reference the tests hold
    the kernel to)."""
    s = lag.shape[0]
    use_kernel = (
        resolve_backend(backend, lag.device) is not Backend.TORCH
        and (lag.is_cuda or backend is not None)
        and s > 0
        and positions.dtype == slots.dtype == lag.dtype == torch.int64
        and seq_lens.dtype == block_tables.dtype == torch.int32
        and block_tables.stride(-1) == 1
        and all(t.stride(0) == 1 for t in (positions, seq_lens, slots, lag))
    )
    if not use_kernel:  # the torch path: about ten small kernels
        moved = positions[: s * q].view(s, q)
        moved -= lag[:, None]
        seq_lens[:s] -= lag.to(seq_lens.dtype)
        pages = block_tables[:s].gather(1, (moved // block_size).long()).long()
        slots[: s * q] = (pages * block_size + moved % block_size).view(-1)
        return
    _move_rows_kernel[(s,)](
        positions, seq_lens, slots, block_tables, lag, block_tables.stride(0), q, block_size,
        BLOCK_Q=triton.next_power_of_2(q),
    )  # fmt: skip
