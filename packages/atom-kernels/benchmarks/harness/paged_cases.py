"""Paged-attention inputs the attention benchmarks share: caches at a shape, ragged batches, KV-write
cases, and the generic kernels' calls they compare against."""

from __future__ import annotations

import torch
import triton

from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.decode import decode_splits
from atom_kernels.attention.launch import run_paged_attention
from atom_kernels.cache import KVLayout, kv_cache_shapes, write_kv
from atom_kernels.cache.convert import flash_to_shuffle
from atom_kernels.cache.fp8 import default_fp8_dtype, fp8_max
from atom_kernels.cache.layout import shuffle_width
from atom_kernels.cache.packs import CacheSlots, new_rows
from atom_kernels.cache.write_shuffle import shuffle_write_tiles, write_shuffle_kernel

HQ, HKV, D = 32, 8, 128
PAGE = 16

DEV = torch.device("cuda")


def bench(fn) -> float:
    """Median milliseconds."""
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def paged_cache(batch: int, seq_len: int, block_size: int, layout: KVLayout, dtype, fp8_scales=None):
    """Random K/V for `batch` sequences of seq_len tokens in a paged cache with shuffled block tables.

    Returns (k_cache, v_cache, block_tables, k_scale, v_scale, contiguous k, v as [B, Hkv, L, D] bf16).
    """
    pages = seq_len // block_size
    num_blocks = batch * pages
    perm = torch.randperm(num_blocks, device=DEV, dtype=torch.int32)
    block_tables = perm.view(batch, pages)
    k = torch.randn(batch, seq_len, HKV, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(batch, seq_len, HKV, D, device=DEV, dtype=torch.bfloat16)
    slots = (block_tables.long()[:, :, None] * block_size + torch.arange(block_size, device=DEV)).view(-1)
    cache_dtype = default_fp8_dtype(DEV) if fp8_scales else dtype
    shapes = kv_cache_shapes(KVLayout.FLASH, num_blocks, block_size, HKV, D, cache_dtype)
    kc = torch.empty(shapes[0], device=DEV, dtype=cache_dtype)
    vc = torch.empty(shapes[1], device=DEV, dtype=cache_dtype)
    k_scale = v_scale = None
    if fp8_scales == "tensor":
        k_scale = (k.abs().amax().float() / fp8_max(cache_dtype)).reshape(1)
        v_scale = (v.abs().amax().float() / fp8_max(cache_dtype)).reshape(1)
    elif fp8_scales == "token":
        k_scale = torch.empty(num_blocks, HKV, block_size, device=DEV)
        v_scale = torch.empty_like(k_scale)
    write_kv(k.view(-1, HKV, D), v.view(-1, HKV, D), kc, vc, slots, k_scale=k_scale, v_scale=v_scale)
    if layout is KVLayout.SHUFFLE:
        kc, vc = flash_to_shuffle(kc, vc)
    return (
        kc,
        vc,
        block_tables,
        k_scale,
        v_scale,
        k.transpose(1, 2).contiguous(),
        v.transpose(1, 2).contiguous(),
    )


def generic_tile_decode(
    q, kc, vc, *, seq_lens, block_tables, layout, k_scale, v_scale, max_seq_len, out, config
):
    """paged_decode through the generic tile kernel at `config`, for fp8 flash caches that paged_decode
    sends to the Gluon kernel (decode_e4m3.py): both in the same run."""
    batch = seq_lens.numel()
    splits = decode_splits(batch, kc.shape[2], max_seq_len, q.device)
    cu = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    call = PagedCall(q, kc, vc, cu, seq_lens, block_tables, layout, k_scale=k_scale, v_scale=v_scale, out=out)
    return run_paged_attention(call, max_query_len=1, backend="triton", num_splits=splits, config=config)


def ragged_cache(seq_lens: list[int], block_size: int):
    """A flash bf16 paged cache holding sequences of the given lengths (shuffled pages)."""
    pages = [-(-n // block_size) for n in seq_lens]
    perm = torch.randperm(sum(pages), device=DEV, dtype=torch.int32)
    tables = torch.zeros(len(seq_lens), max(pages), dtype=torch.int32, device=DEV)
    start = 0
    for b, n in enumerate(pages):
        tables[b, :n] = perm[start : start + n]
        start += n
    shape = kv_cache_shapes(KVLayout.FLASH, sum(pages), block_size, HKV, D, torch.bfloat16)[0]
    kc = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
    vc = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
    return kc, vc, tables


def write_slots(pattern: str, tokens: int, num_blocks: int, block_size: int) -> torch.Tensor:
    """ "random": distinct random slots (the worst case, as vLLM's cache benchmark draws them); "pages": a
    prefill's pattern, consecutive offsets through randomly ordered pages."""
    if pattern == "random":
        return torch.randperm(num_blocks * block_size, device=DEV)[:tokens]
    pages = torch.randperm(num_blocks, device=DEV)[: tokens // block_size]
    return (pages[:, None] * block_size + torch.arange(block_size, device=DEV)).flatten()


def write_case(layout: KVLayout, fp8: str | None, tokens: int, num_blocks: int, block_size: int):
    """Random bf16 K/V [tokens, Hkv, D], empty caches (fp8 when `fp8` is "tensor" or "token") and their
    scales: (k, v, k_cache, v_cache, k_scale, v_scale)."""
    cache_dtype = default_fp8_dtype(DEV) if fp8 else torch.bfloat16
    shapes = kv_cache_shapes(layout, num_blocks, block_size, HKV, D, cache_dtype)
    kc = torch.empty(shapes[0], device=DEV, dtype=cache_dtype)
    vc = torch.empty(shapes[1], device=DEV, dtype=cache_dtype)
    k = torch.randn(tokens, HKV, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ks = vs = None
    if fp8 == "tensor":
        ks = vs = torch.tensor([0.01], device=DEV)
    elif fp8 == "token":
        ks = torch.empty(num_blocks, HKV, block_size, device=DEV)
        vs = torch.empty_like(ks)
    return k, v, kc, vc, ks, vs


def generic_shuffle_write(k, v, kc, vc, slots, ks, vs, block_h=None, warps=None):
    """A shuffle-layout write through the generic Triton kernel (write_shuffle.py) at (heads per program,
    warps), its defaults from shuffle_write_tiles: for e4m3 caches, which write_kv sends to the Gluon kernel
    (write_shuffle_e4m3.py), so that both are measured in the same run."""
    tokens, x = k.shape[0], shuffle_width(kc.dtype)
    default_h, default_warps = shuffle_write_tiles(HKV, D, x)
    block_h, warps = block_h or default_h, warps or default_warps
    kind = 0 if ks is None else 1 if ks.numel() == 1 else 2
    dst = CacheSlots(kc, vc, slots, *((ks, vs) if kind else (k, v)), HKV, kc.shape[3])
    write_shuffle_kernel[(triton.cdiv(tokens, x), triton.cdiv(HKV, block_h))](
        new_rows(k, v), dst, HEAD_DIM=D, X=x, SCALE_KIND=kind, FP8_MAX=fp8_max(kc.dtype) if kind else 1.0,
        BLOCK_H=block_h, BLOCK_D=D, num_warps=warps,
    )  # fmt: skip


def decode_inputs(batch: int, heads: int, tokens: int):
    """q, K and V caches (pages in random order), block tables, lengths: every sequence `tokens` long."""
    pages = -(-tokens // PAGE)
    blocks = batch * pages
    k = torch.randn(blocks, PAGE, heads, D, device="cuda", dtype=torch.bfloat16)
    tables = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, pages)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((batch,), tokens, device="cuda", dtype=torch.int32)
    return q, k, torch.randn_like(k), tables, lens
