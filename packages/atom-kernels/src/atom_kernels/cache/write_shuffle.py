"""KV-cache write into the shuffle layout (K [N, Hkv, D//x, B, x], V [N, Hkv, B//x, D, x]).

A V run (16 bytes) holds one dim of x consecutive slots, so it can be stored whole only by a program that
has all x tokens writing it. Programs own x consecutive tokens. A run is "complete" when the x tokens
from the one at its first slot (the run's leader) hold its x slots in order, as a prefill's tokens do
whatever the sequence's start in the batch or in its page: the program owning the leader stores it whole
(its tokens may reach into the next program's). Tokens of incomplete runs (a sequence starting or ending
mid-run, scattered decode slots) are stored one element at a time by their own program. K rows (x dims
of one token, 16 bytes) are whole per token; tiles put consecutive tokens on neighbouring lanes so a
page's consecutive slots fill whole lines.

Latency, not bandwidth, bounds a write this small per program: after the slot load, the K rows, the
candidate run's V rows and the slots that confirm the run are all loaded at once (two round trips, as
for the flash layout, instead of four in a row).
"""

import triton
import triton.language as tl

from atom_kernels.cache.quantize import quantize_fp8


@triton.jit
def _load_rows(src_ptr, t, stride_t, stride_h, h, d, mask):
    return tl.load(src_ptr + t * stride_t + h * stride_h + d, mask=mask, other=0.0)


@triton.jit
def write_shuffle_kernel(
    src,
    dst,
    HEAD_DIM: tl.constexpr,
    X: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """src: packs.NewRows; dst: packs.CacheSlots. Program (x tokens, head block)."""
    k_ptr, v_ptr, tokens, stride_kt, stride_kh, stride_vt, stride_vh = src
    k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr, num_heads, block_size = dst
    t0 = tl.program_id(0).to(tl.int64) * X
    h1 = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, X)
    t = t0 + i
    slot = tl.load(slot_ptr + t, mask=t < tokens, other=-1).to(tl.int64)
    live = slot >= 0  # -1: padding, not written
    slot = tl.where(live, slot, 0)
    r = slot % X  # place in its run
    blk = slot // block_size
    off = slot % block_size
    cache_ty = k_cache_ptr.dtype.element_ty
    # The candidate leader: the last token at a run's first slot. A complete run's leader is always the
    # last (the x - 1 tokens after it are the run's), so no other can be complete.
    lead = tl.max(tl.where(live & (r == 0), i, -1))
    s = tl.max(tl.where(i == lead, slot, 0))

    # Dims of equal contiguity take lanes in index order after the contiguous one (Triton's coalescing),
    # so tiles list first the dim whose neighbours should share lines.
    # K tiles [tokens, dim chunks, heads, x]: lanes along x, then tokens (a page's consecutive rows).
    ki = i[:, None, None, None]
    kc = tl.arange(0, BLOCK_D // X)[None, :, None, None]
    kh = h1[None, None, :, None]
    ke = tl.arange(0, X)[None, None, None, :]
    kd = kc * X + ke
    k_live = live[:, None, None, None]
    k_ok = (kh < num_heads) & (kd < HEAD_DIM)
    k = _load_rows(k_ptr, t0 + ki, stride_kt, stride_kh, kh, kd, k_ok & (t0 + ki < tokens))
    # V tiles [dims, heads, tokens]: a run's x tokens in a thread, neighbouring dims on neighbouring lanes.
    vd = tl.arange(0, BLOCK_D)[:, None, None]
    vh = h1[None, :, None]
    vi = i[None, None, :]
    head_ok = (vh < num_heads) & (vd < HEAD_DIM)
    run_t = t0 + lead + vi
    v = _load_rows(v_ptr, run_t, stride_vt, stride_vh, vh, vd, head_ok & (lead >= 0) & (run_t < tokens))
    # Complete: the x tokens from the leader (t - r) hold the run's slots in order.
    lead_t = (t - r)[:, None] + i[None, :]
    mates = tl.load(slot_ptr + lead_t, mask=(lead_t >= 0) & (lead_t < tokens), other=-1).to(tl.int64)
    in_order = tl.sum((mates == (slot - r)[:, None] + i[None, :]).to(tl.int32), 1) == X

    k_blk = blk[:, None, None, None]
    k_offs = off[:, None, None, None]
    if SCALE_KIND > 0:
        k = k.to(tl.float32)
        absmax = tl.max(tl.max(tl.abs(k), axis=3, keep_dims=True), axis=1, keep_dims=True)
        k = quantize_fp8(
            k,
            absmax,
            k_scale_ptr,
            (k_blk * num_heads + kh) * block_size + k_offs,
            k_live & (kh < num_heads),
            SCALE_KIND,
            FP8_MAX,
        )
    k_off = ((k_blk * num_heads + kh) * (HEAD_DIM // X) + kc) * (block_size * X) + k_offs * X + ke
    tl.store(k_cache_ptr + k_off, k.to(cache_ty), mask=k_live & k_ok)

    if tl.max(tl.where(i == lead, in_order.to(tl.int32), 0)) > 0:  # the candidate's run is complete
        v_run = v
        if SCALE_KIND > 0:
            v_run = quantize_fp8(
                v.to(tl.float32),
                tl.max(tl.abs(v.to(tl.float32)), axis=0, keep_dims=True),
                v_scale_ptr,
                ((s // block_size) * num_heads + vh) * block_size + s % block_size + vi,
                vh < num_heads,
                SCALE_KIND,
                FP8_MAX,
            )
        run = ((s // block_size) * num_heads + vh) * (block_size // X) + (s % block_size) // X
        tl.store(v_cache_ptr + run * (HEAD_DIM * X) + vd * X + vi, v_run.to(cache_ty), mask=head_ok)
    loose = live & (in_order == 0)
    if tl.sum(loose.to(tl.int32)) > 0:  # tokens of incomplete runs, element by element
        v_loose = loose[None, None, :]
        v_blk = blk[None, None, :]
        v_offs = off[None, None, :]
        v_mask = v_loose & head_ok
        v_el = _load_rows(v_ptr, t[None, None, :], stride_vt, stride_vh, vh, vd, v_mask).to(tl.float32)
        if SCALE_KIND > 0:
            v_el = quantize_fp8(
                v_el,
                tl.max(tl.abs(v_el), axis=0, keep_dims=True),
                v_scale_ptr,
                (v_blk * num_heads + vh) * block_size + v_offs,
                v_loose & (vh < num_heads),
                SCALE_KIND,
                FP8_MAX,
            )
        v_off = (
            ((v_blk * num_heads + vh) * (block_size // X) + v_offs // X) * (HEAD_DIM * X)
            + vd * X
            + v_offs % X
        )
        tl.store(v_cache_ptr + v_off, v_el.to(cache_ty), mask=v_mask)


def shuffle_write_tiles(num_heads: int, head_dim: int, x: int) -> tuple[int, int]:
    """(heads per program, warps), from benchmarks/sweep_kv_write.py (T=16k, page 16): 16-bit caches write
    one head per program with one warp (more warps were slower); fp8 caches (x = 16 tokens per program)
    tiles of <= 8k elements with two warps (one warp was slower)."""
    if x <= 8:
        return 1, 1
    return min(triton.next_power_of_2(num_heads), max(1, 8192 // (triton.next_power_of_2(head_dim) * x))), 2
