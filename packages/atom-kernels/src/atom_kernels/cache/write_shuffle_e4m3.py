"""KV-cache write into the shuffle layout with an e4m3 cache, for NVIDIA sm_89+, written in Gluon.

Why a kernel of its own: an e4m3 V run is one dim of x = 16 consecutive slots (16 bytes), so the tile a
program loads (tokens x dims, dims contiguous) must be stored transposed. Triton's generic lowering of
write_shuffle.py passes the bf16 V tile through shared memory for that (16 KB through a 4 KB scratch, four
rounds with barriers), and decides which runs are complete from 16 x 16 slot loads that wait on the slot
load: those two, not DRAM, bound it.

Here, per program (16 consecutive tokens, one KV head, one warp):
- K: a thread holds 16 dims (one 16-byte cache row) of 4 tokens, loaded and stored as they lie.
- V: a thread holds D/32 adjacent dims of all 16 tokens. Loaded with the dims innermost (a warp load covers
  a contiguous stretch of one token's row), the same registers read in token order are 16-byte runs: the
  transpose is a renaming of registers (convert_layout(..., assert_trivial=True) checks it at compile time).
- Runs: a token is in a complete run (x tokens from its run's first slot holding the run's slots in order,
  what write_shuffle.py stores whole) when no "break" (slot[q + 1] != slot[q] + 1) lies between that first
  slot's token and the run's last. The breaks of a 64-token window around the program are one 64-bit mask,
  from two window loads issued with the K and V loads: aligned prefills take one round trip to memory.
A complete run whose first token is not the program's first loads its V rows again (they reach into the
next program's tokens). Tokens of incomplete runs (decode's scattered slots) store their V one byte at a
time, from rows laid out as K's. Per-token V scales take each token's maximum from rows laid out as K's too
(read again, from L1): in the [D, 16] tile a token's dims span the warp (16 x 5 shuffles, against 4 x 3).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from atom_kernels.gluon_helpers import max2, or2, page_of

X: gl.constexpr = gl.constexpr(16)  # e4m3 elements per 16-byte run: tokens per program
HEAD_DIMS = (64, 128)  # a V thread's dims (D / 32) and K's 16-dim rows tile these exactly


@gluon.jit
def _inverse_scales(
    absmax, scale_ptr, scale_off, scale_mask, SCALE_KIND: gl.constexpr, FP8_MAX: gl.constexpr
):
    """1 / scale, as cache/quantize.py scales: per tensor, read (a scalar); per token, absmax / FP8_MAX (1 for
    an all-zero row), stored at scale_off."""
    if SCALE_KIND == 2:
        scale = gl.where(absmax > 0, absmax / FP8_MAX, 1.0)
        gl.store(scale_ptr + scale_off, scale, mask=scale_mask)
        return 1.0 / scale
    else:
        return 1.0 / gl.load(scale_ptr)


@gluon.jit
def _to_e4m3(x, inv, AXIS: gl.constexpr, SCALE_KIND: gl.constexpr):
    """x ([tokens, dims] or [dims, tokens]; AXIS: its dims) times its inverse scale, to e4m3. The conversion
    saturates (cvt.satfinite on sm_89+): cache/quantize.py's clamp, NaN kept as NaN."""
    x = x.to(gl.float32)
    if SCALE_KIND == 2:  # noqa: SIM108 (a constexpr branch: the other would not compile)
        x = x * gl.expand_dims(inv, AXIS)
    else:
        x = x * inv
    return x.to(gl.float8e4nv)


@gluon.jit
def _absmax(x, AXIS: gl.constexpr):
    return gl.reduce(gl.abs(x.to(gl.float32)), AXIS, max2)


@gluon.jit
def _v_absmax(v_ptr, t, stride_vt, h_off, tokens, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr):
    """Per-token absolute maxima of V rows t .. t + 15, read as rows across lanes (layout ROWS)."""
    tt = t + gl.arange(0, X, layout=gl.SliceLayout(1, ROWS))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ROWS))
    ptrs = v_ptr + gl.expand_dims(tt * stride_vt + h_off, 1) + gl.expand_dims(d, 0)
    rows = gl.load(ptrs, mask=gl.expand_dims(tt < tokens, 1), other=0.0)
    return _absmax(rows, 1)


@gluon.jit
def _load_v(
    v_ptr, t, stride_vt, h_off, tokens, HEAD_DIM: gl.constexpr, LOAD: gl.constexpr, STORE: gl.constexpr
):
    """V rows of tokens t .. t + 15 as [D, 16], dims innermost in registers for the load, handed back
    with the tokens innermost (a register renaming)."""
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, LOAD))
    tt = t + gl.arange(0, X, layout=gl.SliceLayout(0, LOAD))
    ptrs = v_ptr + gl.expand_dims(tt * stride_vt + h_off, 0) + gl.expand_dims(d, 1)
    v = gl.load(ptrs, mask=gl.expand_dims(tt < tokens, 0), other=0.0)
    return gl.convert_layout(v, STORE, assert_trivial=True)


@gluon.jit
def e4m3_shuffle_write_kernel(
    src,
    dst,
    HEAD_DIM: gl.constexpr,
    SCALE_KIND: gl.constexpr,
    FP8_MAX: gl.constexpr,
    PAGE: gl.constexpr,
):
    """src: packs.NewRows; dst: packs.CacheSlots. Grid (cdiv(tokens, 16), heads), one warp.
    K [N, Hkv, D/16, B, 16], V [N, Hkv, B/16, D, 16]."""
    k_ptr, v_ptr, tokens, stride_kt, stride_kh, stride_vt, stride_vh = src
    k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr, num_heads, block_size = dst
    K_TILE: gl.constexpr = gl.BlockedLayout([1, 16], [32 // (HEAD_DIM // 16), HEAD_DIM // 16], [1, 1], [1, 0])
    V_LOAD: gl.constexpr = gl.BlockedLayout([HEAD_DIM // 32, 16], [32, 1], [1, 1], [0, 1])
    V_STORE: gl.constexpr = gl.BlockedLayout([HEAD_DIM // 32, 16], [32, 1], [1, 1], [1, 0])
    TOK: gl.constexpr = gl.SliceLayout(0, V_STORE)  # the 16 tokens, all in each thread's registers
    WINDOW: gl.constexpr = gl.BlockedLayout([2], [32], [1], [0])

    t0 = gl.program_id(0).to(gl.int64) * X
    h = gl.program_id(1)
    page_elems = block_size.to(gl.int64) * HEAD_DIM  # one head's page in either cache

    # Every load of the program is issued here; none waits on another.
    q = gl.arange(0, 4 * X, layout=WINDOW)  # window tokens t0 - 16 .. t0 + 47
    wt = t0 - X + q
    w = gl.load(slot_ptr + wt, mask=(wt >= 0) & (wt < tokens), other=-1).to(gl.int64)
    w_next = gl.load(slot_ptr + wt + 1, mask=(wt + 1 >= 0) & (wt + 1 < tokens), other=-1).to(gl.int64)
    kt = t0 + gl.arange(0, X, layout=gl.SliceLayout(1, K_TILE))
    kd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, K_TILE))
    k_slot = gl.load(slot_ptr + kt, mask=kt < tokens, other=-1).to(gl.int64)
    k_ptrs = k_ptr + gl.expand_dims(kt * stride_kt + h * stride_kh, 1) + gl.expand_dims(kd, 0)
    k = gl.load(k_ptrs, mask=gl.expand_dims(kt < tokens, 1), other=0.0)
    v_own = _load_v(v_ptr, t0, stride_vt, h * stride_vh, tokens, HEAD_DIM, V_LOAD, V_STORE)

    # K: every live token's 16-dim rows.
    k_live = k_slot >= 0  # -1: padding, not written
    k_blk, k_off = page_of(gl.where(k_live, k_slot, 0), block_size, PAGE)
    k_row = (k_blk * num_heads + h) * block_size + k_off  # its scale's index, too
    k8 = _to_e4m3(
        k, _inverse_scales(_absmax(k, 1), k_scale_ptr, k_row, k_live, SCALE_KIND, FP8_MAX), 1, SCALE_KIND
    )
    k_cache_off = gl.expand_dims((k_blk * num_heads + h) * page_elems + k_off * X, 1) + gl.expand_dims(
        (kd // X) * (block_size * X) + kd % X, 0
    )
    gl.store(k_cache_ptr + k_cache_off, k8, mask=gl.expand_dims(k_live, 1))

    # V: which runs are complete, as bit masks over the window. Bit q of `breaks`: window tokens q, q + 1
    # do not hold consecutive slots. A complete run starts at window token q when its slot is a run's first
    # and the 15 steps after it hold no break; own tokens are window tokens 16 .. 31.
    q64 = q.to(gl.int64)
    one = gl.full([4 * X], 1, gl.int64, WINDOW)
    breaks = gl.reduce(gl.where((w < 0) | (w_next != w + 1), one << q64, 0), 0, or2)
    starts = (
        (w >= 0) & (w % X == 0) & (((breaks >> q64) & ((1 << (X - 1)) - 1)) == 0) & (q >= 1) & (q < 2 * X)
    )
    own = (q >= X) & (q < 2 * X)
    # one reduction for two masks: bits 0-31 run starts (window tokens 1 .. 31), 32-47 own live tokens
    bits = gl.where(starts, one << q64, 0) | gl.where(own & (w >= 0), one << (q64 + X), 0)
    bits = gl.reduce(bits, 0, or2)
    start_bits = bits & 0xFFFFFFFF
    live_bits = (bits >> 2 * X) & 0xFFFF
    covered = start_bits | (start_bits << 1)  # bit p: a complete run starting at p - 15 .. p covers p
    covered = covered | (covered << 2)
    covered = covered | (covered << 4)
    covered = covered | (covered << 8)
    loose_bits = live_bits & ~(covered >> X)  # own live tokens in no complete run
    own_starts = (start_bits >> X) & 0xFFFF  # at most one: another would overlap its slots

    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, V_STORE))
    i = gl.arange(0, X, layout=TOK)
    if own_starts != 0:  # the program stores that run whole
        lead = gl.reduce(gl.where(((own_starts >> i) & 1) != 0, i, 0), 0, max2)
        v_run = v_own
        if lead > 0:  # it reaches into the next program's tokens
            v_run = _load_v(v_ptr, t0 + lead, stride_vt, h * stride_vh, tokens, HEAD_DIM, V_LOAD, V_STORE)
        blk, off = page_of(gl.load(slot_ptr + t0 + lead).to(gl.int64), block_size, PAGE)
        run_row = (blk * num_heads + h) * block_size + off  # the run's first token's scale index
        if SCALE_KIND == 2:  # scales from rows across lanes (stored from there), inverses to every thread
            row_max = _v_absmax(v_ptr, t0 + lead, stride_vt, h * stride_vh, tokens, HEAD_DIM, K_TILE)
            row_i = kt - t0
            v_inv = _inverse_scales(row_max, v_scale_ptr, run_row + row_i, row_i >= 0, SCALE_KIND, FP8_MAX)
            v_inv = gl.convert_layout(v_inv, TOK)
        else:
            v_inv = _inverse_scales(0.0, v_scale_ptr, 0, True, SCALE_KIND, FP8_MAX)
        v8 = _to_e4m3(v_run, v_inv, 0, SCALE_KIND)
        run_off = (blk * num_heads + h) * page_elems + off * HEAD_DIM  # off is a multiple of 16
        gl.store(v_cache_ptr + run_off + gl.expand_dims(d * X, 1) + gl.expand_dims(i, 0), v8)
    if loose_bits != 0:  # tokens of incomplete runs (decode's scattered slots): by bytes, laid out as K
        loose = ((loose_bits >> (kt - t0)) & 1) != 0
        rows = gl.load(
            v_ptr + gl.expand_dims(kt * stride_vt + h * stride_vh, 1) + gl.expand_dims(kd, 0),
            mask=gl.expand_dims(loose, 1),
            other=0.0,
        )
        v_inv = _inverse_scales(_absmax(rows, 1), v_scale_ptr, k_row, loose, SCALE_KIND, FP8_MAX)
        el_off = (k_blk * num_heads + h) * page_elems + (k_off // X) * (HEAD_DIM * X) + k_off % X
        gl.store(
            v_cache_ptr + gl.expand_dims(el_off, 1) + gl.expand_dims(kd * X, 0),
            _to_e4m3(rows, v_inv, 1, SCALE_KIND),
            mask=gl.expand_dims(loose, 1),
        )


def e4m3_shuffle_write_supported(k: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether e4m3_shuffle_write_kernel takes this write: NVIDIA sm_89+ (fp32 -> e4m3 conversions), an
    e4m3 cache, head_dim 64 or 128 (the caller has checked the layout's shapes)."""
    return (
        k.is_cuda
        and torch.version.hip is None
        and torch.cuda.get_device_capability(k.device) >= (8, 9)
        and k_cache.dtype == torch.float8_e4m3fn
        and k.shape[-1] in HEAD_DIMS
    )
