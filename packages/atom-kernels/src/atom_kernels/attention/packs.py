"""Argument packs of the paged-attention kernels: one NamedTuple per concern, built once per call.

Triton passes a tuple argument as its fields, each specialized as a plain argument would be (pointer
alignment, integers divisible by 16 or equal to 1), so the kernels and their device helpers take a few
packs instead of forty positional parameters and every launcher builds them the same way. Flags that
follow from the packs (tile rows, padded head dim, soft-cap, window, dot precision) are derived at launch
by the `DERIVED*` tables, the kernels' `@triton.heuristics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import triton

from atom_kernels.cache.fp8 import is_fp8
from atom_kernels.cache.layout import KVLayout, cache_strides, layout_code, shuffle_width

if TYPE_CHECKING:
    from atom_kernels.attention.launch import Checked


class QueryRows(NamedTuple):
    """q [T, Hq, D] read and out [T, Hq, D] written, with their token and head strides."""

    q: torch.Tensor
    out: torch.Tensor
    stride_qt: int
    stride_qh: int
    stride_ot: int
    stride_oh: int


class PagedKV(NamedTuple):
    """The paged cache as the kernels address it (cache/offsets.kv_offsets' geometry)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor  # fp8 scales (KVFormat.SCALE_KIND 1: one value, 2: [N, Hkv, B]); else unread
    v_scale: torch.Tensor
    block_tables: torch.Tensor  # [B, max_pages] int32, rows contiguous
    stride_bt: int
    num_kv_heads: int
    block_size: int
    stride_cb: int  # the strided flash layout's block, token and head strides (0 for the others)
    stride_cn: int
    stride_ch: int


class Scoring(NamedTuple):
    """What turns q.k into attention weights."""

    sm_scale: float
    softcap: float  # 0: none
    window: int  # sliding window in positions; 0: none
    sinks: torch.Tensor  # [Hq] fp32 sink logits; unread unless the kernel's HAS_SINKS


class Partials(NamedTuple):
    """Split-KV partial outputs, merged by a combine kernel."""

    o: torch.Tensor  # fp32, [..., D] per (token, q head, split) or (slot, q head)
    lse: torch.Tensor  # fp32 log2-sum-exp of each partial


class KVFormat(NamedTuple):
    """How cache elements are laid out and converted (compile-time: a kernel variant each)."""

    LAYOUT: int  # layout.layout_code: 0 flash, 1 shuffle, 2 flash with runtime strides
    X: int  # shuffle width: elements per 16 bytes
    V_WORDS: bool  # fp8 V converted from 32-bit words in PTX (fp8_v_as_words)
    SCALE_KIND: int  # 0 none, 1 per tensor, 2 per token and head


def query_rows(q: torch.Tensor, out: torch.Tensor) -> QueryRows:
    return QueryRows(q, out, q.stride(0), q.stride(1), out.stride(0), out.stride(1))


def paged_kv(
    layout: KVLayout,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    c: Checked,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> PagedKV:
    """The cache pack of a checked call; absent scales are stood in for by the cache (never read)."""
    return PagedKV(
        k_cache,
        v_cache,
        k_scale if c.scale_kind else k_cache,
        v_scale if c.scale_kind else v_cache,
        block_tables,
        block_tables.stride(0),
        c.num_kv_heads,
        c.block_size,
        *cache_strides(layout, k_cache),
    )


def scoring(
    softmax_scale: float, softcap: float | None, sliding_window: int | None, sinks: torch.Tensor | None, q
) -> Scoring:
    """Absent sinks are stood in for by q (never read: HAS_SINKS is off)."""
    return Scoring(softmax_scale, softcap or 0.0, sliding_window or 0, sinks if sinks is not None else q)


def kv_format(
    layout: KVLayout, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kind: int
) -> KVFormat:
    return KVFormat(
        layout_code(layout, k_cache), shuffle_width(k_cache.dtype), fp8_v_as_words(layout, q, v_cache), kind
    )


def fp8_v_as_words(layout: KVLayout, q: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the kernels convert fp8 V to fp16 from 32-bit words with PTX (tile.load_e4m3_rows_as_f16):
    e4m3 on NVIDIA, a flash layout whose rows start 16-byte aligned, fp16 compute."""
    return (
        v_cache.is_cuda
        and torch.version.hip is None
        and v_cache.dtype == torch.float8_e4m3fn
        and q.dtype in (torch.float16, torch.bfloat16)
        and layout is KVLayout.FLASH
        and all(s % 16 == 0 for s in v_cache.stride()[:3])
        and v_cache.shape[-1] % 16 == 0
        and v_cache.data_ptr() % 16 == 0
    )


def _dot_precision(args) -> str:
    return "ieee" if args["rows"].q.dtype == torch.float32 else "tf32"


def _fp16_compute(args) -> bool:
    """e4m3 -> fp16 is one packed instruction per two values; -> bf16 is not."""
    return is_fp8(args["kv"].k.dtype) and args["rows"].q.dtype == torch.bfloat16


def _tokens(args) -> int:
    return args["BLOCK_M"] // args["GROUP"]


# Derived constexprs of the kernels (their @triton.heuristics), from the packs and explicit constexprs.
SCORING_FLAGS = {
    "HAS_SOFTCAP": lambda a: a["scores"].softcap != 0.0,
    "HAS_WINDOW": lambda a: a["scores"].window != 0,
}
DERIVED = {  # persistent decode (one token a sequence, no window)
    "BLOCK_D": lambda a: triton.next_power_of_2(a["HEAD_DIM"]),
    "HAS_SOFTCAP": SCORING_FLAGS["HAS_SOFTCAP"],
    "DOT_PRECISION": _dot_precision,
    "FP16_COMPUTE": _fp16_compute,
}
DERIVED_TILED = DERIVED | SCORING_FLAGS | {"TOKENS": _tokens}  # the generic tile kernel
DERIVED_TMA = SCORING_FLAGS | {"TOKENS": _tokens}  # the TMA prefill kernel (16-bit caches of q's dtype)
