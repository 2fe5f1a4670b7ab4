"""Validation and launch shared by the prefill and decode entry points."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import triton

from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.decode_e4m3 import MAX_ROWS, e4m3_decode_kernel, e4m3_decode_supported
from atom_kernels.attention.packs import Partials, kv_format, paged_kv, query_rows, scoring
from atom_kernels.attention.ref import paged_attention_ref
from atom_kernels.attention.tile_kernel import combine_splits_kernel, paged_attention_kernel
from atom_kernels.cache.fp8 import is_fp8, scale_kind
from atom_kernels.cache.layout import KVLayout, cache_geometry, shuffle_width
from atom_kernels.pdl import pdl_launch
from atom_kernels.settings import Backend, resolve_backend


class AttentionKernel(enum.StrEnum):
    """Which kernel run_paged_attention launches (paged_decode picks one in decode.decode_kernel)."""

    TILE = "tile"  # tile_kernel.paged_attention_kernel: every layout, cache dtype and feature
    E4M3_GLUON = "e4m3_gluon"  # decode_e4m3.e4m3_decode_kernel: e4m3 flash caches, one warp per program


@dataclass(frozen=True, slots=True)
class TileConfig:
    """Tuning of one kernel's launch; which kernel runs is run_paged_attention's `kernel` argument."""

    block_m: int  # rows: query tokens x q-heads of one KV head
    block_n: int  # KV positions per step
    num_warps: int
    num_stages: int


@dataclass(frozen=True, slots=True)
class Checked:
    """Geometry and options of one validated paged-attention call."""

    layout: KVLayout
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    scale_kind: int
    softmax_scale: float
    out: torch.Tensor


def check_inputs(call: PagedCall) -> Checked:
    """Validate a paged-attention call; every problem is a ValueError naming the argument."""
    q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables = (
        call.q, call.k_cache, call.v_cache, call.cu_seqlens_q, call.seq_lens, call.block_tables
    )  # fmt: skip
    sinks, k_scale, v_scale, out = call.sinks, call.k_scale, call.v_scale, call.out
    layout = KVLayout(call.layout)
    num_blocks, block_size, num_kv_heads, head_dim = cache_geometry(layout, k_cache, v_cache)
    _, num_q_heads, q_dim = q.shape
    batch = seq_lens.numel()
    if q_dim != head_dim or q.stride(-1) != 1 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"q must be [T, Hq, {head_dim}] with a contiguous last dim and Hq a multiple of Hkv={num_kv_heads}; "
            f"got {tuple(q.shape)}"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q must be fp16, bf16 or fp32, got {q.dtype}")
    if k_cache.dtype != q.dtype and not is_fp8(k_cache.dtype):
        raise ValueError(f"the KV cache must be {q.dtype} or fp8, got {k_cache.dtype}")
    if cu_seqlens_q.shape != (batch + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError("cu_seqlens_q must be [B+1], seq_lens [B] and block_tables [B, max_pages]")
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables rows must be contiguous")
    kind = scale_kind(k_scale, num_blocks, num_kv_heads, block_size)
    if kind != scale_kind(v_scale, num_blocks, num_kv_heads, block_size) or is_fp8(k_cache.dtype) != (
        kind > 0
    ):
        raise ValueError("an fp8 cache needs k_scale and v_scale of one kind; a bf16/fp16 cache takes none")
    if sinks is not None and (sinks.shape != (num_q_heads,) or sinks.dtype != torch.float32):
        raise ValueError(f"sinks must be [{num_q_heads}] float32")
    if call.sliding_window is not None and call.sliding_window < 1:
        raise ValueError("sliding_window must be at least 1")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError("out must be like q")
    scale = call.softmax_scale if call.softmax_scale is not None else head_dim**-0.5
    return Checked(layout, num_blocks, block_size, num_kv_heads, head_dim, kind, scale, out)


def run_paged_attention(
    call: PagedCall,
    *,
    max_query_len: int,
    backend: Backend | str | None,
    num_splits: int,
    config: TileConfig,
    checked: Checked | None = None,
    kernel: AttentionKernel | str = AttentionKernel.TILE,
) -> torch.Tensor:
    """Run `call` (max_query_len: its largest q_len, a host int) with `kernel`, tuned by `config`, over
    num_splits KV splits a sequence. checked: check_inputs(call), when the caller has it already.

    AttentionKernel.E4M3_GLUON needs inputs that decode_e4m3.e4m3_decode_supported accepts, a flash
    layout, at most 16 rows per tile and one warp.
    """
    kernel = AttentionKernel(kernel)
    c = checked or check_inputs(call)
    q, k_cache, v_cache, seq_lens = call.q, call.k_cache, call.v_cache, call.seq_lens
    layout, out, scale, kind = c.layout, c.out, c.softmax_scale, c.scale_kind
    block_size, num_kv_heads, head_dim = c.block_size, c.num_kv_heads, c.head_dim
    tokens, num_q_heads, _ = q.shape
    batch = seq_lens.numel()
    if resolve_backend(backend, q.device) is Backend.TORCH:
        return out.copy_(paged_attention_ref(call))
    if tokens == 0 or batch == 0:
        return out

    check_shuffle_tile(layout, config.block_n, k_cache.dtype)
    group = num_q_heads // num_kv_heads
    block_m = max(config.block_m, triton.next_power_of_2(group))
    tiles = triton.cdiv(max_query_len, block_m // group)
    parts = Partials(out, out)  # placeholders when there is one split
    if num_splits > 1:
        parts = Partials(
            torch.empty((tokens, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device),
            torch.empty((tokens, num_q_heads, num_splits), dtype=torch.float32, device=q.device),
        )
    grid = (tiles * num_splits, batch, num_kv_heads)
    pdl = pdl_launch(q.device)
    rows = query_rows(q, out)
    kv = paged_kv(layout, k_cache, v_cache, call.block_tables, c, call.k_scale, call.v_scale)
    scores = scoring(scale, call.softcap, call.sliding_window, call.sinks, q)
    common = (rows, kv, scores, parts, seq_lens, call.cu_seqlens_q, num_q_heads)
    if kernel is AttentionKernel.E4M3_GLUON:
        if (
            block_m != MAX_ROWS
            or config.num_warps != 1
            or layout is not KVLayout.FLASH
            or not e4m3_decode_supported(q, k_cache, v_cache)
        ):
            raise ValueError(
                "the e4m3_gluon kernel needs e4m3_decode_supported inputs, at most 16 rows per tile and "
                "one warp"
            )
        e4m3_decode_kernel[grid](
            *common, GROUP=group, NUM_SPLITS=num_splits, SCALE_KIND=kind, HAS_SINKS=call.sinks is not None,
            HEAD_DIM=head_dim, BLOCK_N=config.block_n, STAGES=config.num_stages,
            PAGE=block_size if block_size & (block_size - 1) == 0 else 0, num_warps=1,
        )  # fmt: skip
    else:
        paged_attention_kernel[grid](
            *common, FMT=kv_format(layout, q, k_cache, v_cache, kind), GROUP=group, NUM_SPLITS=num_splits,
            HAS_SINKS=call.sinks is not None, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=config.block_n,
            PDL=pdl, num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl,
        )  # fmt: skip
    if num_splits > 1:
        # one warp up to 16 splits, two beyond: faster than four warps at 16 and at 64 splits
        # (sweep_small_kernels.py, 32 heads of 128; results/h200/archive/small_kernels.log)
        combine_splits_kernel[(tokens, num_q_heads)](
            parts, out, scores.sinks, out.stride(0), out.stride(1), num_q_heads, NUM_SPLITS=num_splits,
            HAS_SINKS=call.sinks is not None, HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=triton.next_power_of_2(head_dim), PDL=pdl, launch_pdl=pdl,
            num_warps=1 if num_splits <= 16 else 2,
        )  # fmt: skip
    return out


def check_shuffle_tile(layout: KVLayout, block_n: int, cache_dtype: torch.dtype) -> None:
    """The kernels load shuffle V as whole x-position runs, so KV tiles must start at multiples of x."""
    x = shuffle_width(cache_dtype)
    if layout is KVLayout.SHUFFLE and block_n % x:
        raise ValueError(
            f"a shuffle cache of {cache_dtype} needs KV tiles of a multiple of x={x} positions, got {block_n}"
        )


def on_gpu(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"
