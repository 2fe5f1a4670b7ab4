"""Split-K in one launch: the last program of an output tile sums the tile's partials.

A weight with few output rows and a long K (Llama-3-8B's down projection: 4096 x 14336) gives a tile per
64 rows, too few programs to keep every SM loading. Cutting K over programs fixes that, but summing the
fp32 partials in a second kernel (what cuBLAS's split-K does) costs a launch. Here each program stores its
partial tile, then takes a ticket from the tile's counter; the program that draws the last ticket sums every
partial in split order (the result does not depend on which program finished last) and writes the output.
It also puts the counter back to zero, so the next launch, or the next CUDA-graph replay, starts clean.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Output tiles one launch may cut: a split launch has at most a few hundred (splitting only pays while
# tiles are fewer than the SMs), so this bounds the counters' memory, not the shapes that run.
MAX_SPLIT_TILES = 4096

_counters: dict[tuple[str, int], torch.Tensor] = {}


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 counters [MAX_SPLIT_TILES] for split launches on the current stream of `device`.

    One set per stream: launches on one stream run one after another, so they can share counters (each
    launch leaves them at zero); launches on two streams may overlap and must not."""
    if tiles > MAX_SPLIT_TILES:
        raise ValueError(f"a split-K launch takes at most {MAX_SPLIT_TILES} output tiles, got {tiles}")
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (str(device), stream)
    if key not in _counters:
        _counters[key] = torch.zeros(MAX_SPLIT_TILES, dtype=torch.int32, device=device)
    return _counters[key]


@triton.jit
def split_total(
    acc,
    partial_ptr,
    counter_ptr,
    tile,
    split,
    tiles,
    splits,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    """Store this program's fp32 [ROWS, COLS] partial for `tile`; return (whether this program drew the last
    ticket, the sum of all `splits` partials in split order, zeros for the others).

    partial_ptr: fp32 [splits, tiles, ROWS, COLS]; counter_ptr: int32 [tiles], zero before the launch."""
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    tl.store(partial_ptr + (split * tiles + tile).to(tl.int64) * (ROWS * COLS) + offs, acc)
    # every thread's stores precede the ticket, whose release makes them visible to the last program
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = ticket == splits - 1
    total = tl.zeros([ROWS, COLS], tl.float32)
    if last:
        for s in range(splits):
            # .cg: straight from L2, where the other programs' stores are
            total += tl.load(
                partial_ptr + (s * tiles + tile).to(tl.int64) * (ROWS * COLS) + offs, cache_modifier=".cg"
            )
        tl.atomic_xchg(counter_ptr + tile, 0)
    return last, total
