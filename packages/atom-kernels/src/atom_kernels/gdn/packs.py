"""Argument packs of the gated-delta-rule kernels (recurrent.py, chunked.py).

Triton passes a tuple argument as its fields, each specialized as a plain argument would be, so a kernel
takes its tensors' rows, the request state slots and the chunked path's device plan and intermediates as
four or five packs instead of thirty positional parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class TokenHeads(NamedTuple):
    """x [T, H, D] (a strided view with a contiguous last dim) with its token and head strides."""

    x: torch.Tensor
    stride_t: int
    stride_h: int


def token_heads(x: torch.Tensor) -> TokenHeads:
    return TokenHeads(x, x.stride(0), x.stride(1))


class StateSlots(NamedTuple):
    """The request states [slots, HV, Dv, Dk] (or conv1d's windows [slots, dim, W-1], stride_sh then a
    channel's stride) and each sequence's slot ([S], -1: padding) and fresh-start flag ([S] int8, 0: start
    from zeros; unread without HAS_INIT)."""

    state: torch.Tensor
    stride_ss: int
    stride_sh: int
    indices: torch.Tensor
    init: torch.Tensor


def state_slots(
    state: torch.Tensor, indices: torch.Tensor, has_initial_state: torch.Tensor | None
) -> StateSlots:
    init = has_initial_state.to(torch.int8) if has_initial_state is not None else indices
    return StateSlots(state, state.stride(0), state.stride(1), indices, init)


class GatingPtrs(NamedTuple):
    """gdn_gating's inputs as a kernel reads them (call.Gating): A_log, dt_bias [HV]; a, b [T, HV] with
    their row strides. Unread without FUSED_GATING (any tensor stands in)."""

    a_log: torch.Tensor
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor
    stride_a: int
    stride_b: int


def gating_ptrs(stand_in: torch.Tensor, gating=None) -> GatingPtrs:
    if gating is None:
        return GatingPtrs(stand_in, stand_in, stand_in, stand_in, 0, 0)
    return GatingPtrs(
        gating.A_log, gating.a, gating.dt_bias, gating.b, gating.a.stride(0), gating.b.stride(0)
    )


class ChunkPlan(NamedTuple):
    """The chunked path's plan, made on the device (chunked.plan_chunks): each chunk's sequence (-1 past
    the last), first token and end token; each sequence's first chunk [S+1]; and the chunk after which
    each sequence's snapshot is kept ([S], -1: none). A sequence's chunks are 64 tokens from its start,
    except that one ends at its snapshot, where the next begins."""

    chunk_seq: torch.Tensor
    chunk_start: torch.Tensor
    chunk_end: torch.Tensor
    first_chunk: torch.Tensor
    snapshot_chunk: torch.Tensor


class ChunkBuffers(NamedTuple):
    """Per (chunk, value head) intermediates: cumulative log decay [C] fp32, w [C, BK], u [C, BV], keys
    decayed to the chunk's end [C, BK], whole decay fp32, state before the chunk [BK, BV] (transposed) and
    corrected values [C, BV]; 16-bit ones in the activations' dtype."""

    cum: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor
    kd: torch.Tensor
    decay: torch.Tensor
    h: torch.Tensor
    v_new: torch.Tensor
