"""Split counts x tile configurations for long-context decode, as graph replays (what bounds B=1 at 32k-64k).

  python -m benchmarks run sweep_decode_long -- --configs 64/2/3,64/2/5,128/4/2 --shapes "1x8x32768:32,64,128;1x8x131072:32,64" [--combine]

A config is block_n/num_warps/num_stages of the generic tile kernel; a shape is BxHkv xL, every sequence L
tokens, with the split counts to try after the colon (Hq 32, D 128, page 16, a bf16 flash cache, pages in
random order). Each row checks the output against paged_decode's and reports the graph-replay time and %
of the copy bandwidth of the same run; paged_decode's own plan is the first line of each shape.
--combine also times combine_splits_kernel alone at 32 and 64 splits.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

from atom_kernels.attention import paged_decode
from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.launch import TileConfig, run_paged_attention
from atom_kernels.attention.packs import Partials
from atom_kernels.attention.tile_kernel import combine_splits_kernel
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.graph_timing import graph_ms, rotation
from benchmarks.harness.paged_cases import HQ, D, decode_inputs


def _run(inputs, out, splits: int, config: TileConfig):
    q, kc, vc, tables, lens = inputs
    cu = torch.arange(lens.numel() + 1, device=q.device, dtype=torch.int32)
    call = PagedCall(q, kc, vc, cu, lens, tables, out=out)
    return run_paged_attention(call, max_query_len=1, backend="triton", num_splits=splits, config=config)


def _plan(inputs, out, tokens: int):
    q, kc, vc, tables, lens = inputs
    return paged_decode(q, kc, vc, seq_lens=lens, block_tables=tables, max_seq_len=tokens, out=out)


def _combine_us(splits: int) -> float:
    """combine_splits_kernel alone over 32 heads of 128, four rotated copies."""
    part_o = torch.randn(4, 1, HQ, splits, D, device="cuda")
    part_lse = torch.randn(4, 1, HQ, splits, device="cuda")
    out = torch.empty(4, 1, HQ, D, device="cuda", dtype=torch.bfloat16)

    def call(i: int) -> None:
        combine_splits_kernel[(1, HQ)](
            Partials(part_o[i], part_lse[i]), out[i], out[i], out.stride(1), out.stride(2), HQ, NUM_SPLITS=splits,
            HAS_SINKS=False, HEAD_DIM=D, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=D, PDL=False,
            num_warps=1 if splits <= 16 else 2,
        )  # fmt: skip

    return graph_ms([lambda i=i: call(i) for i in range(4)]) * 1e3


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", required=True, help="block_n/warps/stages, comma-separated")
    parser.add_argument("--shapes", required=True, help="BxHkvxL:splits,splits;... ")
    parser.add_argument("--combine", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    configs = [TileConfig(16, *map(int, c.split("/"))) for c in args.configs.split(",")]
    shapes = []
    for spec in args.shapes.split(";"):
        dims, splits = spec.split(":")
        shapes.append((tuple(map(int, dims.split("x"))), [int(s) for s in splits.split(",")]))
    copy_bw, _ = measure_ceilings()
    print(f"copy {copy_bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for (batch, heads, tokens), split_counts in shapes:
        kv_bytes = batch * tokens * heads * D * 2 * 2
        copies = [decode_inputs(batch, heads, tokens) for _ in range(min(rotation(kv_bytes), 64))]
        outs = [torch.empty_like(c[0]) for c in copies]
        want = _plan(copies[0], outs[0], tokens).clone()
        plan_ms = graph_ms(
            [lambda c=c, o=o, t=tokens: _plan(c, o, t) for c, o in zip(copies, outs, strict=True)]
        )
        print(
            f"B={batch} Hkv={heads} L={tokens}: paged_decode {plan_ms * 1e3:.1f} us "
            f"{kv_bytes / (plan_ms * 1e-3) / copy_bw * 100:.0f}% ideal {kv_bytes / copy_bw * 1e6:.1f} us",
            flush=True,
        )
        best = None
        for splits, config in itertools.product(split_counts, configs):
            got = _run(copies[0], outs[0], splits, config)
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
            ms = graph_ms(
                [
                    lambda c=c, o=o, s=splits, t=config: _run(c, o, s, t)
                    for c, o in zip(copies, outs, strict=True)
                ]
            )
            pct = kv_bytes / (ms * 1e-3) / copy_bw * 100
            tiles = [config.block_n, config.num_warps, config.num_stages]
            rows.append(
                dict(batch=batch, kv_heads=heads, tokens=tokens, splits=splits, tiles=tiles, us=ms * 1e3)
            )
            rows[-1]["pct_copy"] = pct
            print(f"  s{splits:<3d} {'/'.join(map(str, tiles))}: {ms * 1e3:6.1f} us {pct:4.0f}%", flush=True)
            if best is None or ms < best[0]:
                best = (ms, splits, config)
        print(f"  best: s{best[1]} {best[2]} {best[0] * 1e3:.1f} us", flush=True)
        del copies, outs
    combine = {s: _combine_us(s) for s in (32, 64)} if args.combine else {}
    for s, us in combine.items():
        print(f"combine s{s}: {us:.2f} us", flush=True)
    return dict(copy_bw_gbs=copy_bw / 1e9, rows=rows, combine_us=combine)


if __name__ == "__main__":
    main()
