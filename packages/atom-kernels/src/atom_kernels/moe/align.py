"""Token-by-expert ordering for the grouped GEMM: each expert's (token, slot) pairs padded to whole tiles.

No host sync, and shapes fixed by T, k, E and the tile height, so it can be captured in a CUDA graph; at
decode sizes launch count is what costs, which is why this is not a chain of ~25 torch ops. Up to
SMALL_ORDER_PAIRS pairs (decode), one program does it all in one launch: counts, tile offsets and ranks
from one-hot comparisons held in registers. Beyond, three launches (count with ranks, tile offsets,
scatter) after one memset spread the pairs over many programs. Buffers are sized for the worst case and
the GEMM reads how many rows are real from `num_padded`.

Within an expert, the one-program path orders pairs by pair id; the multi-launch path by the atomic that
counted them. Each output row of the GEMMs depends on its own row alone, so the order never changes a
result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs


@dataclass(frozen=True, slots=True)
class ExpertOrder:
    """Pairs p = token * k + slot grouped by expert, each expert's run padded to a multiple of block_m.

    sorted_pairs: [capacity] int32, pair ids in expert order; padding holds num_pairs (matches no pair).
    tile_expert:  [capacity // block_m] int32, the expert each tile of block_m rows belongs to.
    num_padded:   [1] int32, rows in use (a multiple of block_m); tiles past it are skipped.
    pair_tiles:   one token's order (order_one_token): tile p holds pair p alone in its first row and
                  tile_expert is the token's top-k ids; sorted_pairs and num_padded are None.
    """

    sorted_pairs: torch.Tensor | None
    tile_expert: torch.Tensor
    num_padded: torch.Tensor | None
    num_pairs: int
    block_m: int
    pair_tiles: bool = False

    @property
    def capacity(self) -> int:
        """Rows of the ordered layout (a multiple of block_m)."""
        return self.num_pairs * self.block_m if self.pair_tiles else self.sorted_pairs.numel()


def order_one_token(topk_ids: torch.Tensor, block_m: int) -> ExpertOrder:
    """A single token's k pairs, one tile each, with no kernel at all: the ids are the tiles' experts.
    Top-k experts are distinct, so no expert's weights are read twice (repeated ids would still be right,
    each pair's tile reading its expert again). topk_ids: [1, k] int32/int64."""
    if topk_ids.shape[0] != 1:
        raise ValueError(f"order_one_token takes one token's ids [1, k], got {tuple(topk_ids.shape)}")
    ids = topk_ids.reshape(-1)
    return ExpertOrder(
        None, ids if ids.is_contiguous() else ids.contiguous(), None, ids.numel(), block_m, True
    )


# Pairs (T * k) up to which one program orders them: bench_moe_order.py has it faster at 8-32 pairs, about
# even at 128 and slower beyond (at 512, a B=64 decode of k=8)
SMALL_ORDER_PAIRS = 64


def order_capacity(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows needed in the worst case: at most min(E, pairs) experts are hit, each padded by < block_m."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-rows // block_m) * block_m


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, rank_ptr, num_pairs, BLOCK: tl.constexpr, PDL: tl.constexpr):
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    expert = tl.load(ids_ptr + offs, mask=mask, other=0)
    rank = tl.atomic_add(counts_ptr + expert, 1, mask=mask)  # the old count: this pair's place in its run
    tl.store(rank_ptr + offs, rank, mask=mask)


@triton.jit
def _tiles_kernel(
    counts_ptr,
    start_ptr,
    tile_expert_ptr,
    num_padded_ptr,
    sorted_pairs_ptr,
    experts,
    num_pairs,
    capacity,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    e = tl.arange(0, BLOCK_E)
    counts = tl.load(counts_ptr + e, mask=e < experts, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    tl.store(start_ptr + e, end - padded, mask=e < experts)
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    end = tl.where(e < experts, end, 2**30)  # lanes past E never count as ended
    _tile_layout(end, tile_expert_ptr, sorted_pairs_ptr, experts, num_pairs, capacity, BLOCK_M, BLOCK_T)


@triton.jit
def _tile_layout(
    end,
    tile_expert_ptr,
    sorted_pairs_ptr,
    experts,
    num_pairs,
    capacity,
    BLOCK_M: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Each tile's expert (from the experts' padded run ends), and every row marked as padding."""
    for t0 in range(0, capacity // BLOCK_M, BLOCK_T):
        tile = t0 + tl.arange(0, BLOCK_T)
        # A tile's expert is how many experts' padded runs end at or before the tile's first row.
        ended = tl.sum((end[None, :] <= tile[:, None] * BLOCK_M).to(tl.int32), axis=1)
        tl.store(tile_expert_ptr + tile, tl.minimum(ended, experts - 1), mask=tile < capacity // BLOCK_M)
    for r0 in range(0, capacity, BLOCK_T):
        row = r0 + tl.arange(0, BLOCK_T)
        tl.store(sorted_pairs_ptr + row, tl.full([BLOCK_T], 0, tl.int32) + num_pairs, mask=row < capacity)


@triton.jit
def _order_small_kernel(
    ids_ptr,
    sorted_pairs_ptr,
    tile_expert_ptr,
    num_padded_ptr,
    experts,
    num_pairs,
    capacity,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
):
    """The whole ordering in one program: a [BLOCK_P, BLOCK_E] one-hot of each block of pairs gives the
    counts, and on a second pass each pair's rank (pairs of its expert before it)."""
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    e = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for p0 in range(0, num_pairs, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        expert = tl.load(ids_ptr + p, mask=p < num_pairs, other=-1).to(tl.int32)
        counts += tl.sum((expert[:, None] == e[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    start = end - padded
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    end = tl.where(e < experts, end, 2**30)  # lanes past E never count as ended
    _tile_layout(end, tile_expert_ptr, sorted_pairs_ptr, experts, num_pairs, capacity, BLOCK_M, BLOCK_T)
    tl.debug_barrier()  # the padding marks above land before the pairs below overwrite their rows
    seen = start  # the next free row of each expert's run
    for p0 in range(0, num_pairs, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        expert = tl.load(ids_ptr + p, mask=p < num_pairs, other=-1).to(tl.int32)
        hit = (expert[:, None] == e[None, :]).to(tl.int32)
        earlier = tl.cumsum(hit, axis=0) - hit  # pairs of the same expert earlier in this block
        row = tl.sum(hit * (earlier + seen[None, :]), axis=1)
        tl.store(sorted_pairs_ptr + row, p.to(tl.int32), mask=p < num_pairs)
        seen += tl.sum(hit, axis=0)


@triton.jit
def _scatter_kernel(
    ids_ptr, rank_ptr, start_ptr, sorted_pairs_ptr, num_pairs, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    expert = tl.load(ids_ptr + offs, mask=mask, other=0)
    dest = tl.load(start_ptr + expert, mask=mask, other=0) + tl.load(rank_ptr + offs, mask=mask, other=0)
    tl.store(sorted_pairs_ptr + dest, offs.to(tl.int32), mask=mask)


def order_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, *, one_program: bool | None = None
) -> ExpertOrder:
    """topk_ids: [T, k] int32/int64 with values in [0, E) -> ExpertOrder (Triton; CUDA or the interpreter).
    one_program: force the one-launch path (True) or the multi-launch one (False); default by pair count."""
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    pairs, device = ids.numel(), ids.device
    capacity = order_capacity(pairs, num_experts, block_m)
    sorted_pairs = torch.empty(capacity, dtype=torch.int32, device=device)
    tile_expert = torch.empty(capacity // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    block_e = triton.next_power_of_2(num_experts)
    block_t = max(16, min(128, 8192 // block_e))
    if one_program is None:
        one_program = pairs <= SMALL_ORDER_PAIRS
    pdl = pdl_launch(device)
    if one_program:
        _order_small_kernel[(1,)](
            ids, sorted_pairs, tile_expert, num_padded, num_experts, pairs, capacity, BLOCK_M=block_m,
            BLOCK_E=block_e, BLOCK_P=max(1, min(32, 8192 // block_e)), BLOCK_T=block_t, PDL=pdl, num_warps=4,
            launch_pdl=pdl,
        )  # fmt: skip
        return ExpertOrder(sorted_pairs, tile_expert, num_padded, pairs, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    rank = torch.empty(pairs, dtype=torch.int32, device=device)
    start = torch.empty(num_experts, dtype=torch.int32, device=device)
    block = 1024
    grid = (triton.cdiv(pairs, block),)
    if pairs:
        _count_kernel[grid](ids, counts, rank, pairs, BLOCK=block, PDL=pdl, launch_pdl=pdl)
    _tiles_kernel[(1,)](
        counts, start, tile_expert, num_padded, sorted_pairs, num_experts, pairs, capacity, BLOCK_M=block_m,
        BLOCK_E=block_e, BLOCK_T=block_t, PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
    if pairs:
        _scatter_kernel[grid](ids, rank, start, sorted_pairs, pairs, BLOCK=block, PDL=pdl, launch_pdl=pdl)
    return ExpertOrder(sorted_pairs, tile_expert, num_padded, pairs, block_m)
