"""Absorbed MLA over a paged latent cache, split-KV: decode, speculative verify and extend are one kernel.

One program takes one query token, a block of its heads and one slice of its cached rows; each row
is read once per program as K (all 576 values) and as V (the first 512), so the latent cache streams
once per head block. Slices of a long sequence run in parallel and a combine step merges them by
their log-sum-exp (flash decoding) when tokens x head blocks cannot fill the GPU.

Two orientations of the same loop. Heads as the MMA's rows (S = Q K^T, O = P V) suits many heads per
program; heads as its columns (S^T = K Q^T, O^T = V^T P^T, the "swap AB" of small-head MLA decode)
keeps both of a Hopper warpgroup MMA's operands in shared memory for the 16-head tiles of a TP shard,
where 16 rows cannot fill a warpgroup MMA and the q operand held in registers spilled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from atom_kernels.attention.packs import Partials, query_rows
from atom_kernels.mla.cache import check_latent_dtype
from atom_kernels.mla.call import MlaCall
from atom_kernels.mla.ref import mla_attention_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import SETTINGS, Backend, resolve_backend

LOG2E = 1.4426950408889634


@dataclass(frozen=True, slots=True)
class MlaTiles:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    heads_as_n: bool = False  # heads as the MMAs' last dimension (_mla_kernel's HEADS_AS_N)


def mla_tiles(
    num_heads: int, itemsize: int = 2, *, fp8_cache: bool = False, interpret: bool = False
) -> MlaTiles:
    """Few heads (a TP shard): the step streams the cache, 16-head tiles. Many heads: taller head tiles
    reuse each row for more heads (fewer cache passes) at the cost of registers for the [H, 512] acc.
    fp32 (exact products, no tensor-core path) takes the smallest tiles to fit shared memory."""
    if interpret or itemsize >= 4:
        return MlaTiles(16, 16, 4 if not interpret else 1, 1)
    # From benchmarks/bench_mla.py --sweep (B=64 L=4k; results/h200/archive/sweep_mla.log). Few heads stream
    # the cache in 128-position steps; fp8 rows take the transposed loop, whose e4m3 -> fp16 operands
    # spill least. Many heads: 64-row head tiles, 64-position steps, two stages (one for fp8 rows, whose
    # converted operands leave no registers for a second).
    if num_heads <= 16:
        return MlaTiles(16, 64, 4, 2, heads_as_n=True) if fp8_cache else MlaTiles(16, 128, 8, 2)
    return MlaTiles(64, 64, 8, 1 if fp8_cache else 2)


class LatentCache(NamedTuple):
    """The paged latent cache [N, B, R + P] as the kernels read it: its pages, the e4m3 scale [1] (unread
    without HAS_SCALE) and the block table [S, pages]."""

    cache: torch.Tensor
    scale: torch.Tensor
    block_tables: torch.Tensor
    stride_bt: int
    block_size: int


# exact fp32 products for fp32 activations, TF32 otherwise
_DERIVED = {"PRECISION": lambda args: "ieee" if args["rows"].q.dtype == torch.float32 else "tf32"}


@triton.jit
def _token_of(cu_q_ptr, max_q):
    """Program (token slot, ...) -> its sequence, its index among the sequence's queries, their count (the
    slot holds a token when index < count) and the first one's row."""
    seq = tl.program_id(0) // max_q
    qi = tl.program_id(0) % max_q
    q_start = tl.load(cu_q_ptr + seq)
    return seq, qi, tl.load(cu_q_ptr + seq + 1) - q_start, q_start


@triton.jit
def _slice_of(seq_lens_ptr, seq, qi, q_len, num_splits, BLOCK_N: tl.constexpr):
    """Program (..., slice)'s rows [lo, hi) of those its token sees (causal: up to its own position).
    Read after the program knows it holds a token: an earlier load kept registers from the loop."""
    kv_len = tl.load(seq_lens_ptr + seq) - q_len + qi + 1
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = tl.program_id(2) * chunk
    return lo, tl.minimum(lo + chunk, kv_len)


@triton.jit
def _scales(latent, sm_scale_log2, HAS_SCALE: tl.constexpr):
    """(the fp8 rows' scale, or 1; the scores' log2 scale with it folded in: fp8 rows are x / scale)."""
    kv_scale = 1.0
    if HAS_SCALE:
        kv_scale = tl.load(latent.scale)
    return kv_scale, sm_scale_log2 * kv_scale


@triton.jit
def _row_tile(latent, table, start, hi, dt, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows start .. start + BLOCK_N (those below hi) of a sequence's latent cache, through its block-table
    row: (which are real, their [BLOCK_N, RANK] latent part and [BLOCK_N, ROPE] rope part, in dt)."""
    pos = start + tl.arange(0, BLOCK_N)
    ok = pos < hi
    page = tl.load(table + pos // latent.block_size, mask=ok, other=0).to(tl.int64)
    row = latent.cache + (page * latent.block_size + pos % latent.block_size) * (RANK + ROPE)
    kv = tl.load(row[:, None] + tl.arange(0, RANK)[None, :], mask=ok[:, None], other=0.0).to(dt)
    kp = tl.load(row[:, None] + RANK + tl.arange(0, ROPE)[None, :], mask=ok[:, None], other=0.0).to(dt)
    return ok, kv, kp


@triton.jit
def _along_heads(x, HEADS_AS_N: tl.constexpr):
    """A [BLOCK_H] vector laid along the heads' axis of a tile: its columns with HEADS_AS_N, else its rows."""
    return x[None, :] if HEADS_AS_N else x[:, None]


@triton.jit
def _across_heads(x, HEADS_AS_N: tl.constexpr):
    """A vector of the other axis (latent columns, cache rows) laid across the heads of a tile."""
    return x[:, None] if HEADS_AS_N else x[None, :]


@triton.heuristics(_DERIVED)
@triton.jit
def _mla_kernel(
    rows,
    latent,
    parts,
    seq_lens_ptr,
    cu_q_ptr,
    sm_scale_log2,
    num_heads,
    max_q,
    num_splits,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEADS_AS_N: tl.constexpr,
    COMPUTE_F16: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """rows: attention.packs.QueryRows (q [T, H, R + P], out [T, H, R]); latent: LatentCache; parts:
    attention.packs.Partials ([T, H, splits, R] and [T, H, splits]; unused with one split).

    Heads are the MMAs' rows (S = Q K^T, O = P V), or with HEADS_AS_N their last dimension: the row
    tile is the first operand (K as [rows, R + P], V^T as [R, rows]), so q^T and P^T are read from
    shared memory. Every tile below is [BLOCK_H, *] or, transposed, [*, BLOCK_H]."""
    let_next_launch(PDL)
    wait_for_inputs(PDL)  # q, the cache rows just written, the bounds: all written inside the step
    seq, qi, q_len, q_start = _token_of(cu_q_ptr, max_q)
    if qi >= q_len:
        return
    t = (q_start + qi).to(tl.int64)
    lo, hi = _slice_of(seq_lens_ptr, seq, qi, q_len, num_splits, BLOCK_N)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = _along_heads(heads < num_heads, HEADS_AS_N)
    c = _across_heads(tl.arange(0, RANK), HEADS_AS_N)
    r = _across_heads(tl.arange(0, ROPE), HEADS_AS_N)
    HEAD_AXIS: tl.constexpr = 0 if HEADS_AS_N else 1  # the axis that reductions over a head's rows take
    # e4m3 -> fp16 is one exact instruction per pair (-> bf16 goes through fp32): fp8 rows compute in fp16
    dt = tl.float16 if COMPUTE_F16 else rows.q.dtype.element_ty
    q_at = rows.q + t * rows.stride_qt + _along_heads(heads, HEADS_AS_N).to(tl.int64) * rows.stride_qh
    q_nope = tl.load(q_at + c, mask=h_ok, other=0.0).to(dt)
    q_pe = tl.load(q_at + RANK + r, mask=h_ok, other=0.0).to(dt)
    kv_scale, qk_scale = _scales(latent, sm_scale_log2, HAS_SCALE)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], dtype=tl.float32)
    if HEADS_AS_N:
        acc = tl.zeros([RANK, BLOCK_H], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_H, RANK], dtype=tl.float32)
    table = latent.block_tables + seq.to(tl.int64) * latent.stride_bt
    for start in range(lo, hi, BLOCK_N):
        ok, kv, kp = _row_tile(latent, table, start, hi, dt, RANK, ROPE, BLOCK_N)
        if HEADS_AS_N:
            s = tl.dot(kv, q_nope, input_precision=PRECISION)
            s = tl.dot(kp, q_pe, s, input_precision=PRECISION)  # [BLOCK_N, BLOCK_H]
        else:
            s = tl.dot(q_nope, tl.trans(kv), input_precision=PRECISION)
            s += tl.dot(q_pe, tl.trans(kp), input_precision=PRECISION)
        s = tl.where(_across_heads(ok, HEADS_AS_N), s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=HEAD_AXIS))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - _along_heads(m_new, HEADS_AS_N))
        denom = denom * alpha + tl.sum(p, axis=HEAD_AXIS)
        if HEADS_AS_N:
            acc = tl.dot(tl.trans(kv), p.to(dt), acc * alpha[None, :], input_precision=PRECISION)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(dt), kv, input_precision=PRECISION)
        m = m_new
    has_rows = denom > 0.0  # a slice past this token's rows (short sequences, many slices) has none
    safe_denom = _along_heads(tl.where(has_rows, denom, 1.0), HEADS_AS_N)
    o = tl.where(_along_heads(has_rows, HEADS_AS_N), acc / safe_denom, 0.0) * kv_scale
    if num_splits == 1:
        o_at = rows.out + t * rows.stride_ot + _along_heads(heads, HEADS_AS_N).to(tl.int64) * rows.stride_oh
        tl.store(o_at + c, o.to(rows.out.dtype.element_ty), mask=h_ok)
    else:
        slot = (t * num_heads + heads).to(tl.int64) * num_splits + tl.program_id(2)
        tl.store(parts.o + _along_heads(slot, HEADS_AS_N) * RANK + c, o, mask=h_ok)
        lse = tl.where(has_rows, m + tl.log2(tl.where(has_rows, denom, 1.0)), float("-inf"))
        tl.store(parts.lse + slot, lse, mask=heads < num_heads)


@triton.jit
def _mla_combine_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    num_heads,
    stride_ot,
    stride_oh,
    num_splits,
    BLOCK_S: tl.constexpr,
    RANK: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    base = (t * num_heads + h) * num_splits
    lse = tl.load(part_lse_ptr + base + s, mask=s < num_splits, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, axis=0))  # every token has >= 1 row, so some slice is finite
    w = w / tl.sum(w, axis=0)
    c = tl.arange(0, RANK)
    o = tl.load(
        part_o_ptr + (base + s)[:, None] * RANK + c[None, :], mask=(s < num_splits)[:, None], other=0.0
    )
    out = tl.sum(o * w[:, None], axis=0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + c, out.to(out_ptr.dtype.element_ty))


def mla_num_splits(programs: int, max_kv_len: int, tiles: MlaTiles, device: torch.device) -> int:
    """Slices per token, each >= 4 row tiles: enough programs for two waves of the SMs when the step
    streams the cache (few heads); one wave when tall head tiles make it compute-heavy (bench_mla.py's
    sweep: Hq=128, B=64 ran fastest unsplit at 128 programs)."""
    block_n = tiles.block_n
    if SETTINGS.triton_interpret:
        return min(4, max(1, max_kv_len // (4 * block_n)))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    waves = 1 if tiles.block_h >= 64 else 2
    wanted = round(waves * sms / max(1, programs))  # 128 programs on 132 SMs: one wave, no split
    return max(1, min(wanted, max_kv_len // (4 * block_n), 64))


def mla_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    *,
    softmax_scale: float,
    max_query_len: int,
    kv_lora_rank: int = 512,
    scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    tiles: MlaTiles | None = None,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Absorbed MLA: q [T, Hq, R + P] against each sequence's paged latent rows -> out [T, Hq, R].

    cache: [N, B, R + P] (bf16/fp16 like q, or fp8 e4m3 with scale [1] fp32); cu_seqlens_q: [S+1] int32;
    seq_lens: [S] int32, cached rows per sequence including its new tokens; block_tables: [S, pages].
    Each sequence's q_len queries are its last tokens (decode: 1; verify: a few; extend: its new chunk)
    and see rows up to their own position. max_query_len: the largest q_len (a host int, fixes the grid).
    softmax_scale: the model's (DeepSeek: (192 ** -0.5) * mscale ** 2). Slices per token (num_splits)
    default from the grid and the block table's capacity, so the launch is CUDA-graph safe; tiles
    overrides the tile shape (benchmark sweeps).
    """
    tokens, num_heads, width = q.shape if q.dim() == 3 else (0, 0, 0)
    rope = width - kv_lora_rank
    if q.dim() != 3 or rope <= 0 or q.stride(-1) != 1:
        raise ValueError(
            f"q must be [T, Hq, {kv_lora_rank} + rope] with a contiguous last dim, got {tuple(q.shape)}"
        )
    if cache.dim() != 3 or cache.shape[2] != width or not cache.is_contiguous():
        raise ValueError(f"cache must be a contiguous [N, B, {width}] tensor, got {tuple(cache.shape)}")
    fp8 = check_latent_dtype(cache, scale, q.dtype, "q")
    if cu_seqlens_q.shape != (seq_lens.numel() + 1,) or block_tables.shape[0] != seq_lens.numel():
        raise ValueError(
            f"cu_seqlens_q [S+1], seq_lens [S] and block_tables [S, pages] disagree: {tuple(cu_seqlens_q.shape)}, "
            f"{tuple(seq_lens.shape)}, {tuple(block_tables.shape)}"
        )
    if out is None:
        out = torch.empty(tokens, num_heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    elif out.shape != (tokens, num_heads, kv_lora_rank) or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(
            f"out must be [{tokens}, {num_heads}, {kv_lora_rank}] {q.dtype}, last dim contiguous"
        )
    if resolve_backend(backend, q.device) is Backend.TORCH:
        call = MlaCall(
            q, cache, cu_seqlens_q, seq_lens, block_tables, softmax_scale, kv_lora_rank, scale if fp8 else None
        )  # fmt: skip
        want = mla_attention_ref(call)
        return out.copy_(want)
    pow2 = triton.next_power_of_2
    if pow2(kv_lora_rank) != kv_lora_rank or pow2(rope) != rope or rope < 16:
        raise ValueError(
            f"the Triton MLA kernel needs power-of-two widths (rope >= 16), got {kv_lora_rank} + {rope}"
        )
    if tokens == 0:
        return out
    tiles = tiles or mla_tiles(
        num_heads, q.element_size(), fp8_cache=fp8, interpret=SETTINGS.triton_interpret
    )
    head_blocks = triton.cdiv(num_heads, tiles.block_h)
    capacity = block_tables.shape[1] * cache.shape[1]
    splits = num_splits or mla_num_splits(tokens * head_blocks, capacity, tiles, q.device)
    parts = Partials(out, out)  # placeholders with one split
    if splits > 1:
        parts = Partials(
            torch.empty(tokens, num_heads, splits, kv_lora_rank, dtype=torch.float32, device=q.device),
            torch.empty(tokens, num_heads, splits, dtype=torch.float32, device=q.device),
        )
    grid = (seq_lens.numel() * max_query_len, head_blocks, splits)
    compute_f16 = tiles.heads_as_n and fp8 and q.dtype != torch.float32
    latent = LatentCache(cache, scale if fp8 else q, block_tables, block_tables.stride(0), cache.shape[1])
    pdl = pdl_launch(q.device)
    _mla_kernel[grid](
        query_rows(q, out), latent, parts, seq_lens, cu_seqlens_q, softmax_scale * LOG2E, num_heads,
        max_query_len, splits, RANK=kv_lora_rank, ROPE=rope, HAS_SCALE=fp8, BLOCK_H=tiles.block_h,
        BLOCK_N=tiles.block_n, HEADS_AS_N=tiles.heads_as_n, COMPUTE_F16=compute_f16, PDL=pdl,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=pdl,
    )  # fmt: skip
    if splits > 1:
        _mla_combine_kernel[(tokens, num_heads)](
            parts.o, parts.lse, out, num_heads, out.stride(0), out.stride(1), splits, BLOCK_S=pow2(splits),
            RANK=kv_lora_rank, PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
    return out
