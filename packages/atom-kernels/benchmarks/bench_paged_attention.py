"""Paged attention and KV-write benchmarks (docs/architecture.md §7), run on the GPU machine.

  python -m benchmarks run paged_attention -- [--quick] [--only write decode long splits persistent prefill]

(`--only long`: decode at B=1 with 32k-128k tokens and B=256 with 2k, not in the default run.)

Per shape: median time (decode: CUDA-graph replays over rotated cache copies, graph_timing.py, as an engine
runs decode, and KV writes, whose ~40 us would otherwise time the host; prefill: triton.testing.do_bench, L2
flushed), achieved TB/s or TFLOP/s, % of the
roofline (bytes at the copy bandwidth measured in this run, or flops at the bf16 matmul rate measured in this
run), and the ratio to a baseline measured in the same run, the same way, on the same data made contiguous
(torch SDPA; for KV writes, a plain copy of the same bytes). A table is printed last; the result holds the rows
as JSON.
"""

from __future__ import annotations

import argparse
import math
from functools import partial

import torch
import torch.nn.functional as F
import triton

from atom_kernels.attention import DecodePartition, paged_decode, paged_decode_persistent, paged_prefill
from atom_kernels.attention.decode import decode_tiles
from atom_kernels.cache import KVLayout, write_kv
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms, rotation
from benchmarks.harness.paged_cases import (
    DEV,
    HKV,
    HQ,
    D,
    bench,
    generic_shuffle_write,
    generic_tile_decode,
    paged_cache,
    ragged_cache,
    write_case,
    write_slots,
)

DECODE_VARIANTS = [  # (layout, fp8 scales, the generic tile kernel)
    (KVLayout.FLASH, None, False),
    (KVLayout.SHUFFLE, None, False),
    (KVLayout.FLASH, "tensor", False),
    (KVLayout.FLASH, "token", False),
    (KVLayout.FLASH, "tensor", True),
    (KVLayout.SHUFFLE, "tensor", False),
]
# Long contexts and a big batch (atom-core's engine-speed issue): B=1 at 32k-128k, B=256 at 2k
LONG_SHAPES = [(1, 32768, 16), (1, 65536, 16), (1, 131072, 16), (256, 2048, 16)]
LONG_VARIANTS = [
    (KVLayout.FLASH, None, False),
    (KVLayout.SHUFFLE, None, False),
    (KVLayout.FLASH, "tensor", False),
]


def decode_rows(copy_bw: float, quick: bool, shapes=None, variants=DECODE_VARIANTS) -> list[dict]:
    """Timed as CUDA-graph replays over rotated cache copies (graph_timing.py), for ours and SDPA alike."""
    rows = []
    shapes = shapes or [(64, 8192, 16), (64, 8192, 64)] + (
        [] if quick else [(1, 32768, 16), (4, 32768, 16), (8, 32768, 16)]
    )
    for batch, seq_len, block_size in shapes:
        for layout, fp8, generic in variants:
            if quick and (layout is KVLayout.SHUFFLE or generic) and batch != 64:
                continue
            kv_bytes = batch * seq_len * HKV * D * 2 * (1 if fp8 else 2) + (
                batch * seq_len * HKV * 4 * 2 if fp8 == "token" else 0
            )
            sdpa_bytes = batch * seq_len * HKV * D * 2 * 2
            q = torch.randn(batch, HQ, D, device=DEV, dtype=torch.bfloat16)
            seq_lens = torch.full((batch,), seq_len, device=DEV, dtype=torch.int32)
            out = torch.empty_like(q)
            ours, sdpa = [], []
            for _ in range(rotation(sdpa_bytes)):
                kc, vc, tables, ks, vs, k, v = paged_cache(
                    batch, seq_len, block_size, layout, torch.bfloat16, fp8
                )
                decode = (
                    partial(generic_tile_decode, config=decode_tiles(kc.dtype, layout))
                    if generic
                    else paged_decode
                )
                ours.append(
                    partial(
                        decode,
                        q,
                        kc,
                        vc,
                        seq_lens=seq_lens,
                        block_tables=tables,
                        layout=layout,
                        k_scale=ks,
                        v_scale=vs,
                        max_seq_len=seq_len,
                        out=out,
                    )
                )
                sdpa.append(partial(F.scaled_dot_product_attention, q[:, :, None], k, v, enable_gqa=True))
            ms = graph_ms(ours)
            ref_ms = graph_ms(sdpa)
            del ours, sdpa
            rows.append(
                dict(
                    op="decode",
                    shape=f"B={batch} L={seq_len} page={block_size}",
                    layout=f"{layout} (generic tile kernel)" if generic else str(layout),
                    kv=f"fp8/{fp8}" if fp8 else "bf16",
                    ms=ms,
                    metric="TB/s",
                    value=kv_bytes / (ms * 1e-3) / 1e12,
                    roofline_pct=100 * (kv_bytes / copy_bw) / (ms * 1e-3),
                    baseline="SDPA contiguous bf16",
                    baseline_ms=ref_ms,
                    baseline_value=sdpa_bytes / (ref_ms * 1e-3) / 1e12,
                    speedup_vs_baseline=ref_ms / ms,
                )
            )
    return rows


def split_rows(copy_bw: float) -> list[dict]:
    """Small batches at L=32k: KV splits per sequence (the grid's choice and fixed counts) and the persistent
    partition, all as graph replays; the baseline is the grid's automatic choice."""
    rows = []
    for batch in (1, 4, 8):
        seq_len, block_size = 32768, 16
        kv_bytes = batch * seq_len * HKV * D * 2 * 2
        q = torch.randn(batch, HQ, D, device=DEV, dtype=torch.bfloat16)
        seq_lens = torch.full((batch,), seq_len, device=DEV, dtype=torch.int32)
        out = torch.empty_like(q)
        caches = [
            paged_cache(batch, seq_len, block_size, KVLayout.FLASH, torch.bfloat16)[:3]
            for _ in range(rotation(kv_bytes))
        ]
        part = DecodePartition.allocate(
            max_batch=batch, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, device=DEV
        )
        common = dict(seq_lens=seq_lens, out=out)
        grid = partial(paged_decode, q, max_seq_len=seq_len, **common)
        auto_ms = graph_ms([partial(grid, kc, vc, block_tables=t) for kc, vc, t in caches])
        variants = [
            (
                f"grid, {n} splits",
                graph_ms([partial(grid, kc, vc, block_tables=t, num_splits=n) for kc, vc, t in caches]),
            )
            for n in (16, 32, 64, 128, 256)
        ]
        variants.append(
            (
                "persistent (plan + decode)",
                graph_ms(
                    [
                        partial(paged_decode_persistent, q, kc, vc, block_tables=t, partition=part, **common)
                        for kc, vc, t in caches
                    ]
                ),
            )
        )
        for label, ms in [("grid, auto splits", auto_ms), *variants]:
            rows.append(
                dict(
                    op="decode splits",
                    shape=f"B={batch} L={seq_len} page={block_size}",
                    layout="flash",
                    kv=label,
                    ms=ms,
                    metric="TB/s",
                    value=kv_bytes / (ms * 1e-3) / 1e12,
                    roofline_pct=100 * (kv_bytes / copy_bw) / (ms * 1e-3),
                    baseline="grid, auto splits",
                    baseline_ms=auto_ms,
                    baseline_value=kv_bytes / (auto_ms * 1e-3) / 1e12,
                    speedup_vs_baseline=auto_ms / ms,
                )
            )
    return rows


def persistent_rows(copy_bw: float) -> list[dict]:
    """Skewed and uniform batches: split-KV grid (auto splits, 16 splits) against the persistent partition."""
    rows = []
    cases = [("1x32k + 63x1k", [32768] + [1024] * 63), ("64x8k uniform", [8192] * 64)]
    for name, seq_lens in cases:
        kc, vc, tables = ragged_cache(seq_lens, 16)
        batch = len(seq_lens)
        q = torch.randn(batch, HQ, D, device=DEV, dtype=torch.bfloat16)
        lens = torch.tensor(seq_lens, device=DEV, dtype=torch.int32)
        out = torch.empty_like(q)
        part = DecodePartition.allocate(
            max_batch=batch, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, device=DEV
        )
        kv_bytes = sum(seq_lens) * HKV * D * 2 * 2
        common = dict(seq_lens=lens, block_tables=tables, out=out)
        grid_ms = bench(partial(paged_decode, q, kc, vc, max_seq_len=max(seq_lens), **common))
        variants = [
            ("split-KV grid, 16 splits", bench(partial(paged_decode, q, kc, vc, num_splits=16, **common))),
            (
                "persistent (plan + decode)",
                bench(partial(paged_decode_persistent, q, kc, vc, partition=part, **common)),
            ),
        ]
        for label, ms in [("split-KV grid, auto splits", grid_ms), *variants]:
            rows.append(
                dict(
                    op="decode skewed" if "32k" in name else "decode",
                    shape=f"{name} page=16",
                    layout="flash",
                    kv=label,
                    ms=ms,
                    metric="TB/s",
                    value=kv_bytes / (ms * 1e-3) / 1e12,
                    roofline_pct=100 * (kv_bytes / copy_bw) / (ms * 1e-3),
                    baseline="split-KV grid, auto splits",
                    baseline_ms=grid_ms,
                    baseline_value=kv_bytes / (grid_ms * 1e-3) / 1e12,
                    speedup_vs_baseline=grid_ms / ms,
                )
            )
    return rows


def prefill_rows(mm_rate: float, quick: bool) -> list[dict]:
    rows = []
    for batch, seq_len, block_size in [(8, 4096, 64)] + ([] if quick else [(1, 16384, 64), (8, 4096, 16)]):
        kc, vc, tables, _, _, k, v = paged_cache(batch, seq_len, block_size, KVLayout.FLASH, torch.bfloat16)
        q = torch.randn(batch * seq_len, HQ, D, device=DEV, dtype=torch.bfloat16)
        cu = torch.arange(0, batch + 1, device=DEV, dtype=torch.int32) * seq_len
        seq_lens = torch.full((batch,), seq_len, device=DEV, dtype=torch.int32)
        out = torch.empty_like(q)
        ms = bench(
            partial(
                paged_prefill,
                q,
                kc,
                vc,
                cu_seqlens_q=cu,
                seq_lens=seq_lens,
                block_tables=tables,
                max_query_len=seq_len,
                out=out,
            )
        )
        qs = q.view(batch, seq_len, HQ, D).transpose(1, 2).contiguous()
        k_rep = k.repeat_interleave(HQ // HKV, dim=1)  # flash SDPA on plain MHA: its fastest path
        v_rep = v.repeat_interleave(HQ // HKV, dim=1)
        ref_ms = bench(partial(F.scaled_dot_product_attention, qs, k_rep, v_rep, is_causal=True))
        flops = 4 * batch * HQ * D * seq_len * seq_len / 2  # causal: half of QK^T and PV
        rows.append(
            dict(
                op="prefill causal",
                shape=f"B={batch} L={seq_len} page={block_size}",
                layout="flash",
                kv="bf16",
                ms=ms,
                metric="TFLOP/s",
                value=flops / (ms * 1e-3) / 1e12,
                roofline_pct=100 * (flops / mm_rate) / (ms * 1e-3),
                baseline="SDPA contiguous (flash)",
                baseline_ms=ref_ms,
                baseline_value=flops / (ref_ms * 1e-3) / 1e12,
                speedup_vs_baseline=ref_ms / ms,
            )
        )
    return rows


def write_rows(copy_bw: float, quick: bool) -> list[dict]:
    """T=16k (a prefill's worth: random slots and page runs) and T=64 (a decode step's scattered slots)."""
    rows = []
    block_size = 16
    cases = [(16384, "random"), (16384, "pages"), (64, "random")]
    for layout in (KVLayout.FLASH, KVLayout.SHUFFLE):
        for fp8 in (None, "tensor", "token"):
            # fp8 shuffle: write_kv's Gluon kernel, then the generic Triton kernel on the same data
            for generic in (False, True) if fp8 and layout is KVLayout.SHUFFLE else (False,):
                for tokens, pattern in cases:
                    num_blocks = max(tokens // block_size * 2, 1024)
                    slots = write_slots(pattern, tokens, num_blocks, block_size)
                    k, v, kc, vc, ks, vs = write_case(layout, fp8, tokens, num_blocks, block_size)
                    write = (
                        partial(generic_shuffle_write, k, v, kc, vc, slots, ks, vs)
                        if generic
                        else partial(write_kv, k, v, kc, vc, slots, layout=layout, k_scale=ks, v_scale=vs)
                    )
                    ms = graph_ms([write])
                    moved = 2 * k.numel() * (2 + kc.element_size()) + (
                        2 * tokens * HKV * 4 if fp8 == "token" else 0
                    )
                    src = torch.cat([k, v]).view(-1)
                    dst = torch.empty_like(src)
                    ref_ms = graph_ms([partial(dst.copy_, src)])
                    rows.append(
                        dict(
                            op="kv write",
                            shape=f"T={tokens} Hkv={HKV} D={D} slots {pattern}",
                            layout=f"{layout} (generic Triton kernel)" if generic else str(layout),
                            kv=f"fp8/{fp8}" if fp8 else "bf16",
                            ms=ms,
                            metric="TB/s",
                            value=moved / (ms * 1e-3) / 1e12,
                            roofline_pct=100 * (moved / copy_bw) / (ms * 1e-3),
                            baseline="copy of K,V (bf16)",
                            baseline_ms=ref_ms,
                            baseline_value=2 * src.numel() * 2 / (ref_ms * 1e-3) / 1e12,
                            speedup_vs_baseline=ref_ms / ms,
                        )
                    )
            if quick:
                break
    return rows


def print_table(rows: list[dict], copy_bw: float, mm_rate: float) -> None:
    print(
        f"\n{torch.cuda.get_device_name()}  copy {copy_bw / 1e12:.2f} TB/s  bf16 matmul {mm_rate / 1e12:.0f} TFLOP/s"
    )
    head = f"{'op':<15}{'shape':<26}{'layout':<30}{'kv':<14}{'ms':>8}{'value':>14}{'%roof':>7}{'base':>14}{'x base':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['op']:<15}{r['shape']:<26}{r['layout']:<30}{r['kv']:<14}{r['ms']:>8.3f}"
            f"{r['value']:>8.2f} {r['metric']:<6}{r['roofline_pct']:>6.0f}%{r['baseline_value']:>8.2f} "
            f"{r['metric']:<6}{r['speedup_vs_baseline']:>7.2f}"
        )


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only", nargs="+", choices=["write", "decode", "long", "splits", "persistent", "prefill"]
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw, mm_rate = measure_ceilings()
    groups = {
        "write": lambda: write_rows(copy_bw, args.quick),
        "decode": lambda: decode_rows(copy_bw, args.quick),
        "long": lambda: decode_rows(copy_bw, False, LONG_SHAPES, LONG_VARIANTS),
        "splits": lambda: split_rows(copy_bw),
        "persistent": lambda: persistent_rows(copy_bw),
        "prefill": lambda: prefill_rows(mm_rate, args.quick),
    }
    default = [name for name in groups if name != "long"]  # --only long: issue shapes, not the default table
    rows = [row for name in (args.only or default) for row in groups[name]()]
    for r in rows:
        assert all(math.isfinite(x) for x in (r["ms"], r["value"], r["baseline_ms"]))
    print_table(rows, copy_bw, mm_rate)
    return dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        copy_tb_s=copy_bw / 1e12,
        bf16_matmul_tflops=mm_rate / 1e12,
        rows=rows,
    )


if __name__ == "__main__":
    main()
