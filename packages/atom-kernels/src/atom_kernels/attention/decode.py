"""Paged decode: one (or a few, for speculative verify) query tokens per sequence, split-KV."""

from __future__ import annotations

import torch
import triton

from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.decode_e4m3 import e4m3_decode_supported
from atom_kernels.attention.launch import AttentionKernel, TileConfig, on_gpu, run_paged_attention
from atom_kernels.cache.fp8 import is_fp8
from atom_kernels.cache.layout import KVLayout
from atom_kernels.settings import Backend

# Split-KV programs per SM, per kernel (decode_splits): the generic kernel's programs have several warps; the
# e4m3 kernel's have one, so more of them share an SM (7 gives the split counts benchmarks/sweep_tiles.py
# found best, at B=64 L=8k and B=4 L=32k).
PROGRAMS_PER_SM = {AttentionKernel.TILE: 2, AttentionKernel.E4M3_GLUON: 7}


def decode_kernel(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: KVLayout | str
) -> AttentionKernel:
    """The kernel paged_decode runs: the Gluon e4m3 kernel (decode_e4m3.py) where it applies (an e4m3
    flash cache on NVIDIA sm_89+, e4m3_decode_supported), else the generic tile kernel."""
    if on_gpu(q) and KVLayout(layout) is KVLayout.FLASH and e4m3_decode_supported(q, k_cache, v_cache):
        return AttentionKernel.E4M3_GLUON
    return AttentionKernel.TILE


def decode_splits(
    batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device, programs_per_sm: int = 2
) -> int:
    """KV splits per sequence so that batch x heads x splits fills the GPU (a power of two, <= 64) with
    programs_per_sm programs per SM (PROGRAMS_PER_SM holds each kernel's).

    Each split keeps at least 128 positions (two 64-wide tiles): a single sequence of a few hundred tokens
    still spreads over several programs per head instead of one that walks it alone.
    """
    if device.type != "cuda":
        return 1 if max_seq_len <= 64 else 2  # exercise both paths on the CPU interpreter cheaply
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.cdiv(programs_per_sm * sms, batch * num_kv_heads)
    cap = max(1, max_seq_len // 128)
    return min(64, triton.next_power_of_2(max(1, min(want, cap))))


# Positions per program (longest sequence / decode_splits' count) from which the generic choice stands: there
# each program streams long enough for two-warp programs at two per SM to keep the bandwidth.
LONG_WALK = 2048


def _prev_power_of_2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def short_walk_plan(
    batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device, head_dim: int = 128
) -> tuple[int, TileConfig] | None:
    """(splits, tiles) for the generic kernel on a 16-bit flash cache when its programs would walk short
    ranges (decode_splits leaving fewer than LONG_WALK positions to each): None otherwise.

    Short walks pay each program's start and the combine more than the stream: at most two programs per
    SM (splits rounded down, not up), each at least one 64-wide tile, and where that leaves few programs
    they get four warps, and 128-wide tiles when each walks 512 positions or more (heads up to 128 wide:
    two stages of wider K and V tiles would not fit in shared memory). From
    benchmarks/sweep_decode_plan.py (results/h200/sweep_decode_plan.jsonl#decode_plan_h200, graph replays): faster than the
    generic plan for B=1 at 600 tokens in a graph sized for 1024, B=64 at 600 tokens and B=1 at 64k; long
    walks (B=4 at 32k, B=32 at 4k) were as fast or faster with the generic plan, which they keep.
    """
    generic = decode_splits(batch, num_kv_heads, max_seq_len, device)
    if device.type != "cuda" or max_seq_len // generic >= LONG_WALK:
        return None
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    fill = max(1, 2 * sms // (batch * num_kv_heads))
    splits = min(64, _prev_power_of_2(min(fill, max(1, max_seq_len // 64))))
    if batch * num_kv_heads * splits > 2 * sms:
        return splits, TileConfig(block_m=16, block_n=64, num_warps=2, num_stages=3)
    if max_seq_len // splits >= 512 and head_dim <= 128:
        return splits, TileConfig(block_m=16, block_n=128, num_warps=4, num_stages=2)
    return splits, TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=3)


def decode_tiles(
    cache_dtype: torch.dtype, layout: KVLayout, kernel: AttentionKernel = AttentionKernel.TILE
) -> TileConfig:
    """GPU decode tiles for `kernel` (from benchmarks/sweep_tiles.py at B=64 L=8k page 16). Flash: Triton
    shares num_stages among the levels of an indirect load (block table, then K and V), so three stages give
    K and V one buffer and five give two; 16-bit caches at three were as fast as at five or seven wherever
    many programs share an SM (benchmarks/sweep_decode_long.py, results/h200/archive/sweep_decode_long_stages.log),
    fp8 rows (half as long) take five. Shuffle:
    one warp per program and two stages; more warps per program were slower. The e4m3 kernel (one warp by
    construction): 16-position tiles, three stages, the sweep's best."""
    if AttentionKernel(kernel) is AttentionKernel.E4M3_GLUON:
        return TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=3)
    if layout is KVLayout.SHUFFLE:
        return TileConfig(block_m=16, block_n=64 if is_fp8(cache_dtype) else 32, num_warps=1, num_stages=2)
    return TileConfig(block_m=16, block_n=64, num_warps=2, num_stages=5 if is_fp8(cache_dtype) else 3)


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    query_len: int = 1,
    layout: KVLayout | str = KVLayout.FLASH,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """Decode attention over a paged KV cache that already holds the new tokens' K/V.

    q: [B * query_len, Hq, D] (query_len tokens per sequence, the sequence's last ones: 1 for plain
    decode, more for speculative verify); seq_lens: [B] int32 tokens in the cache (new ones included);
    block_tables: [B, max_pages] int32. Caches in `layout`, bf16/fp16 like q or fp8 with k_scale/v_scale
    (one fp32 value, or [N, Hkv, block_size]). sinks: [Hq] fp32. Returns out [B * query_len, Hq, D].
    num_splits: KV splits per sequence (default: enough to fill the GPU; pass it, and max_seq_len,
    for CUDA-graph capture, which must not read seq_lens on the host). cu_seqlens_q: [B+1] int32, b *
    query_len; an engine that has it saves building it (two small kernels) in every layer.
    """
    batch = seq_lens.numel()
    if q.shape[0] != batch * query_len:
        raise ValueError(f"q has {q.shape[0]} tokens, expected B * query_len = {batch * query_len}")
    if cu_seqlens_q is None:
        cu_seqlens_q = torch.arange(0, batch + 1, dtype=torch.int32, device=q.device) * query_len
    kernel = decode_kernel(q, k_cache, v_cache, layout)
    config = decode_tiles(k_cache.dtype, KVLayout(layout), kernel) if on_gpu(q) else TileConfig(16, 16, 1, 1)
    if num_splits is None:
        longest = max_seq_len if max_seq_len is not None else int(seq_lens.max()) if batch else 0
        heads = k_cache.shape[2 if KVLayout(layout) is KVLayout.FLASH else 1]
        num_splits = decode_splits(batch, heads, longest, q.device, programs_per_sm=PROGRAMS_PER_SM[kernel])
        generic_flash = kernel is AttentionKernel.TILE and KVLayout(layout) is KVLayout.FLASH
        if on_gpu(q) and generic_flash and k_cache.element_size() == 2:
            plan = short_walk_plan(batch, heads, longest, q.device, q.shape[-1])
            num_splits, config = plan or (num_splits, config)
    call = PagedCall(
        q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, layout, softmax_scale, sliding_window,
        softcap, sinks, k_scale, v_scale, out,
    )  # fmt: skip
    return run_paged_attention(
        call, max_query_len=query_len, backend=backend, num_splits=num_splits, config=config, kernel=kernel
    )
