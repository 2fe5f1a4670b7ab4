"""paged_decode's plan for short walks (decode.short_walk_plan) against the generic one, as graph replays.

  python -m benchmarks run sweep_decode_plan

Each row is one decode call over a bf16 flash cache (Hq 32, D 128, page 16, every sequence L tokens): the
generic plan (decode_splits' count, decode_tiles' two-warp 64-wide tiles) and paged_decode's, which takes
short_walk_plan's where it applies, both captured for a graph sized for max_len (an engine's
max_model_len) and replayed over rotated copies of the cache (graph_timing.py). % of copy: the K and V
bytes read per call over the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse

import torch

from atom_kernels.attention import paged_decode
from atom_kernels.attention.decode import decode_splits, decode_tiles, short_walk_plan
from atom_kernels.cache import KVLayout
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms, rotation
from benchmarks.harness.paged_cases import decode_inputs, generic_tile_decode

HQ, D, PAGE = 32, 128, 16
# (batch, KV heads, tokens per sequence, max_len the graph is sized for)
SHAPES = [
    (1, 8, 600, 1024),
    (1, 4, 600, 1024),
    (1, 8, 600, 4096),
    (1, 8, 2048, 4096),
    (1, 8, 32768, 32768),
    (1, 4, 65536, 65536),
    (1, 8, 131072, 131072),
    (2, 8, 600, 4096),
    (4, 8, 32768, 32768),
    (8, 8, 600, 4096),
    (16, 8, 2048, 4096),
    (32, 8, 4096, 8192),
    (64, 8, 600, 1024),
    (64, 4, 600, 1024),
    (64, 4, 2048, 4096),
    (256, 8, 2048, 4096),
]


def _generic(q, kc, vc, tables, lens, max_len, out):
    """The generic plan: decode_splits' count and decode_tiles' tiles."""
    config = decode_tiles(kc.dtype, KVLayout.FLASH)
    return generic_tile_decode(
        q, kc, vc, seq_lens=lens, block_tables=tables, layout=KVLayout.FLASH, k_scale=None, v_scale=None,
        max_seq_len=max_len, out=out, config=config,
    )  # fmt: skip


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    torch.manual_seed(0)
    copy_bw, _ = measure_ceilings()
    device = torch.device("cuda")
    rows = []
    for batch, heads, tokens, max_len in SHAPES:
        kv_bytes = batch * tokens * heads * D * 2 * 2
        copies = [decode_inputs(batch, heads, tokens) for _ in range(min(rotation(kv_bytes), 64))]
        outs = [torch.empty_like(c[0]) for c in copies]
        want = _generic(*copies[0], max_len, outs[0]).clone()
        got = paged_decode(
            *copies[0][:3], seq_lens=copies[0][4], block_tables=copies[0][3], max_seq_len=max_len
        )
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        generic_ms = graph_ms(
            [lambda c=c, o=o, m=max_len: _generic(*c, m, o) for c, o in zip(copies, outs, strict=True)]
        )
        plan_ms = graph_ms(
            [
                lambda c=c, o=o, m=max_len: paged_decode(
                    c[0], c[1], c[2], seq_lens=c[4], block_tables=c[3], max_seq_len=m, out=o
                )
                for c, o in zip(copies, outs, strict=True)
            ]
        )
        plan = short_walk_plan(batch, heads, max_len, device)
        generic_splits = decode_splits(batch, heads, max_len, device)
        row = dict(
            batch=batch,
            kv_heads=heads,
            tokens=tokens,
            max_len=max_len,
            generic=dict(
                splits=generic_splits,
                us=generic_ms * 1e3,
                pct_copy=kv_bytes / (generic_ms * 1e-3) / copy_bw * 100,
            ),
            plan=dict(
                splits=plan[0] if plan else generic_splits,
                tiles=None if plan is None else [plan[1].block_n, plan[1].num_warps, plan[1].num_stages],
                us=plan_ms * 1e3,
                pct_copy=kv_bytes / (plan_ms * 1e-3) / copy_bw * 100,
            ),
            speedup=generic_ms / plan_ms,
        )
        rows.append(row)
        g, p = row["generic"], row["plan"]
        print(
            f"B={batch:<3d} Hkv={heads} L={tokens:<6d} max={max_len:<6d} generic {g['us']:7.1f} us "
            f"{g['pct_copy']:4.0f}% (s{g['splits']}) | plan {p['us']:7.1f} us {p['pct_copy']:4.0f}% "
            f"(s{p['splits']} {p['tiles'] or 'generic'}) | {row['speedup']:.2f}x",
            flush=True,
        )
        del copies, outs
    record = dict(
        device=torch.cuda.get_device_name(), copy_bw_gbs=copy_bw / 1e9, hq=HQ, head_dim=D, rows=rows
    )
    return record


if __name__ == "__main__":
    main()
