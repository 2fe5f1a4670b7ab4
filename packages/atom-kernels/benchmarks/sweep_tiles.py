"""Tile-configuration sweep for paged decode and prefill on the GPU (picks the launch defaults).

  python -m benchmarks run sweep_tiles -- [WORD ...]
Runs the cases whose names contain every WORD (all cases without words). Prints, per case, the fastest configurations (median ms) and the current default's time.
"""

from __future__ import annotations

import itertools
import sys
from functools import partial

import torch
import triton

from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.launch import AttentionKernel, TileConfig, check_inputs, run_paged_attention
from atom_kernels.attention.prefill_tma import run_tma_prefill, tma_prefill_fits
from atom_kernels.cache import KVLayout
from benchmarks.harness.graph_timing import graph_ms
from benchmarks.harness.paged_cases import DEV, HQ, D, paged_cache


def time_config(case, config, splits, graph=False, kernel=AttentionKernel.TILE):
    """Median ms of run_paged_attention's `kernel` at `config`; graph=True times CUDA-graph replays
    (decode: a ~0.3 ms call's eager timing includes the host's launch cost)."""
    q, kc, vc, tables, ks, vs, cu, seq_lens, max_q, layout = case
    call = PagedCall(q, kc, vc, cu, seq_lens, tables, layout, k_scale=ks, v_scale=vs, out=torch.empty_like(q))
    fn = partial(
        run_paged_attention, call, max_query_len=max_q, backend="triton", num_splits=splits, config=config,
        kernel=kernel,
    )  # fmt: skip
    try:
        return (
            graph_ms([fn]) if graph else triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
        )
    except Exception as err:  # out of shared memory, etc.
        return (
            float("inf") if "resources" in str(err).lower() or "shared" in str(err).lower() else _raise(err)
        )


def time_tma_config(case, config, splits):
    """The TMA prefill kernel (prefill_tma.py) at `config`; splits must be 1."""
    q, kc, vc, tables, _, _, cu, seq_lens, max_q, layout = case
    call = PagedCall(q, kc, vc, cu, seq_lens, tables, layout)
    c = check_inputs(call)
    if splits != 1 or not tma_prefill_fits(call, c, config.block_n):
        return float("inf")
    fn = partial(run_tma_prefill, call, c, max_query_len=max_q, config=config)
    try:
        return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
    except Exception as err:  # out of shared memory or registers, or a shape the compiler refuses
        print(f"  {config}: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
        return float("inf")


def _raise(err):
    raise err


def decode_case(batch, seq_len, page, layout, fp8):
    kc, vc, tables, ks, vs, _, _ = paged_cache(batch, seq_len, page, layout, torch.bfloat16, fp8)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=torch.bfloat16)
    cu = torch.arange(batch + 1, device=DEV, dtype=torch.int32)
    return (
        q,
        kc,
        vc,
        tables,
        ks,
        vs,
        cu,
        torch.full((batch,), seq_len, device=DEV, dtype=torch.int32),
        1,
        layout,
    )


def prefill_case(batch, seq_len, page):
    kc, vc, tables, _, _, _, _ = paged_cache(batch, seq_len, page, KVLayout.FLASH, torch.bfloat16)
    q = torch.randn(batch * seq_len, HQ, D, device=DEV, dtype=torch.bfloat16)
    cu = torch.arange(batch + 1, device=DEV, dtype=torch.int32) * seq_len
    seq_lens = torch.full((batch,), seq_len, device=DEV, dtype=torch.int32)
    return q, kc, vc, tables, None, None, cu, seq_lens, seq_len, KVLayout.FLASH


def selected(name: str) -> bool:
    return all(word in name for word in sys.argv[1:])


def sweep(name, case, configs, splits_options, bytes_or_flops, unit, timer=time_config):
    results = []
    for config, splits in itertools.product(configs, splits_options):
        results.append((timer(case, config, splits), config, splits))
    results.sort(key=lambda r: r[0])
    print(f"\n{name}")
    for ms, config, splits in results[:8]:
        print(f"  {ms:8.3f} ms  {bytes_or_flops / (ms * 1e-3) / 1e12:7.2f} {unit}  splits={splits} {config}")


def main():
    torch.manual_seed(0)
    decode_configs = [
        TileConfig(16, n, w, s) for n, w, s in itertools.product((32, 64, 128), (1, 2, 4), (2, 3, 4, 5, 6))
    ]
    shuffle_configs = [  # tiles of whole 16-byte runs: multiples of x = 8 (bf16) or 16 (fp8) positions
        TileConfig(16, n, w, s) for n, w, s in itertools.product((32, 64), (1, 2, 4), (2, 3, 4))
    ]
    e4m3_configs = [  # decode_e4m3.py: one warp
        TileConfig(16, n, 1, s) for n, s in itertools.product((16, 32, 64), (2, 3, 4))
    ]
    for batch, seq_len, layout, fp8, gluon in [
        (64, 8192, KVLayout.FLASH, None, False),
        (64, 8192, KVLayout.FLASH, "tensor", False),
        (64, 8192, KVLayout.SHUFFLE, None, False),
        (64, 8192, KVLayout.SHUFFLE, "tensor", False),
        (4, 32768, KVLayout.FLASH, None, False),
        (1, 32768, KVLayout.SHUFFLE, None, False),
        (64, 8192, KVLayout.FLASH, "tensor", True),
        (64, 8192, KVLayout.FLASH, "token", True),
        (4, 32768, KVLayout.FLASH, "tensor", True),
        (1, 32768, KVLayout.FLASH, "tensor", True),
    ]:
        name = f"decode B={batch} L={seq_len} page=16 {layout} {fp8 or 'bf16'}{' gluon' if gluon else ''}"
        if not selected(name):
            continue
        case = decode_case(batch, seq_len, 16, layout, fp8)
        kv_bytes = case[1].numel() * case[1].element_size() * 2
        splits = (1, 2) if batch == 64 else (8, 16, 32, 64) if batch > 1 else (32, 64, 128)
        if gluon:  # one-warp programs: more of them
            splits = (2, 4, 8) if batch == 64 else (16, 32, 64, 128) if batch > 1 else (64, 128, 256)
        configs = e4m3_configs if gluon else decode_configs if layout is KVLayout.FLASH else shuffle_configs
        kernel = AttentionKernel.E4M3_GLUON if gluon else AttentionKernel.TILE
        timer = partial(time_config, graph=True, kernel=kernel)
        sweep(name, case, configs, splits, kv_bytes, "TB/s", timer=timer)
    prefill_configs = [
        TileConfig(m, n, w, s)
        for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))
    ]
    flops = 4 * 8 * HQ * D * 4096 * 4096 / 2
    if selected("prefill causal B=8 L=4096 page=64"):
        sweep(
            "prefill causal B=8 L=4096 page=64",
            prefill_case(8, 4096, 64),
            prefill_configs,
            (1,),
            flops,
            "TFLOP/s",
        )
    tma_configs = [
        TileConfig(m, n, w, s)
        for m, n, w, s in itertools.product((64, 128, 256), (32, 64), (4, 8), (2, 3, 4, 5))
    ]
    if selected("prefill TMA causal B=8 L=4096 page=64"):
        sweep(
            "prefill TMA causal B=8 L=4096 page=64",
            prefill_case(8, 4096, 64),
            tma_configs,
            (1,),
            flops,
            "TFLOP/s",
            timer=time_tma_config,
        )
    small_tiles = [TileConfig(m, 16, w, s) for m, w, s in itertools.product((64, 128), (4, 8), (3, 4, 5))]
    if selected("prefill TMA causal B=8 L=4096 page=16"):
        sweep(
            "prefill TMA causal B=8 L=4096 page=16",
            prefill_case(8, 4096, 16),
            small_tiles,
            (1,),
            flops,
            "TFLOP/s",
            timer=time_tma_config,
        )


if __name__ == "__main__":
    main()
