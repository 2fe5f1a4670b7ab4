"""Tickets for reductions finished by the last program to arrive, inside the launch that made the parts.

A split computation (the split-K GEMMs of linear/ and fp8/) stores one partial per program, and some
program must sum them. A second kernel costs a launch; instead each program takes a ticket from its output
tile's counter after storing its partial, and the one that draws the last ticket reads every partial and
writes the result. It also puts the counter back to zero, so the next launch, or the next CUDA-graph
replay, starts clean: the counters are zeroed once, when first allocated.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Output tiles one launch may count: split launches have at most a few hundred (splitting only pays while
# programs are few), so this bounds the counters' memory, not the shapes that run.
MAX_TICKET_TILES = 4096

_counters: dict[tuple[str, int], torch.Tensor] = {}


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 counters [MAX_TICKET_TILES] for ticket launches on the current stream of `device`.

    One set per stream: launches on one stream run one after another, so they can share counters (each
    launch leaves them at zero; a launch with PDL touches them only after its wait, pdl.py); launches on
    two streams may overlap and must not."""
    if tiles > MAX_TICKET_TILES:
        raise ValueError(f"a ticket launch takes at most {MAX_TICKET_TILES} output tiles, got {tiles}")
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (str(device), stream)
    if key not in _counters:
        _counters[key] = torch.zeros(MAX_TICKET_TILES, dtype=torch.int32, device=device)
    return _counters[key]


@triton.jit
def draws_last(counter_ptr, tile, parts):
    """Call after this program's partial is stored: whether it drew the last of `parts` tickets of `tile`.
    The ticket's release makes every thread's stores visible to the last program, whose acquire (and loads
    with cache_modifier=".cg") sees all partials."""
    tl.debug_barrier()  # every thread's stores precede the ticket
    return tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu") == parts - 1


@triton.jit
def reset_ticket(counter_ptr, tile):
    """The last program, done: the tile's counter back to zero for the next launch."""
    tl.atomic_xchg(counter_ptr + tile, 0)
