"""All-reduce of decode-sized messages on one host's GPUs: atom-kernels' one-shot kernel over peer
memory against NCCL and against torch's symmetric-memory one-shot op, each timed inside a CUDA graph of
50 back-to-back calls (as a decode step replays them). Then what a decoder layer does with the sum: add
the residual and RMSNorm it, as NCCL or the one-shot kernel followed by the norm kernel against
`all_reduce_rms_norm` (one launch, no barrier: count-tagged words); "exact" there is the fused sum
bit-equal to the one-shot kernel's, and the normalized row within 1 bf16 ulp of the norm kernel's.

  torchrun --nproc-per-node 2 -m benchmarks run all_reduce

Messages: rows x hidden bf16 (hidden 4096: Llama-3-8B; 7168: DeepSeek-V3). Bus bandwidth as NCCL reports
it for an all-reduce: 2 (world - 1) / world x bytes / time.
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

from atom_kernels.comm import (
    MAX_ROWS,
    all_reduce_ref,
    all_reduce_rms_norm,
    fused_buffer_bytes,
    one_shot_all_reduce,
    pad_slots,
)
from atom_kernels.norm import rms_norm

CALLS, REPLAYS = 50, 20
SHAPES = [(1, 4096), (8, 4096), (32, 4096), (64, 4096), (128, 4096), (256, 4096), (1, 7168), (64, 7168)]


def graph_time_us(fn) -> float:
    """us per call of fn, CALLS of them captured in one graph and replayed REPLAYS times. Not
    graph_timing.graph_ms: it sizes each graph from the rank's own eager timing, and ranks whose graphs
    hold different numbers of calls would wait at the kernel's barriers forever."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(REPLAYS):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (REPLAYS * CALLS) * 1e6


def _with_norm(x, nccl_buf, fused_args, buffers, pads, rank):
    """The all-reduce then the residual add and RMSNorm, three ways -> (calls, the fused sum bit-equal
    to the one-shot kernel's and the normalized row within one bf16 ulp of the norm kernel's)."""
    tokens, hidden = x.shape
    residual = torch.randn(tokens, hidden, device=x.device, dtype=x.dtype)
    weight = torch.rand(hidden, device=x.device, dtype=x.dtype) + 0.5
    y, s = all_reduce_rms_norm(x, weight, 1e-6, residual, **fused_args)
    want = rms_norm(one_shot_all_reduce(x, buffers, pads, rank), weight, 1e-6, residual)
    torch.cuda.synchronize()
    close = torch.allclose(y.float(), want[0].float(), rtol=2**-7, atol=0)  # the sum's order may differ
    exact = torch.equal(s, want[1]) and close

    def nccl_then_norm():
        dist.all_reduce(nccl_buf)
        return rms_norm(nccl_buf.view(tokens, hidden), weight, 1e-6, residual)

    calls = {
        "nccl+norm": nccl_then_norm,
        "atom_one_shot+norm": lambda: rms_norm(
            one_shot_all_reduce(x, buffers, pads, rank), weight, 1e-6, residual
        ),
        "atom_fused_norm": lambda: all_reduce_rms_norm(x, weight, 1e-6, residual, **fused_args),
    }
    return calls, exact


GROUP = "0"  # the default group's name (symmetric memory addresses groups by name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true", help="also time the kernel's other block sizes")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.barrier(device_ids=[rank])
    largest = max(r * h for r, h in SHAPES) * 2
    storage = symm_mem.empty(largest + pad_slots(world) * 4, dtype=torch.uint8, device=device)
    storage[largest:].zero_()
    assert dist.group.WORLD.group_name == GROUP
    handle = symm_mem.rendezvous(storage, GROUP)
    buffers = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)
    pads = torch.tensor([p + largest for p in handle.buffer_ptrs], dtype=torch.int64, device=device)
    torch_in = symm_mem.empty(largest // 2, dtype=torch.bfloat16, device=device)
    symm_mem.rendezvous(torch_in, GROUP)
    fused = symm_mem.empty(fused_buffer_bytes(world, largest), dtype=torch.uint8, device=device)
    fused.zero_()
    fused_handle = symm_mem.rendezvous(fused, GROUP)
    fused_args = dict(
        buffers=torch.tensor(list(fused_handle.buffer_ptrs), dtype=torch.int64, device=device),
        half_bytes=largest,
        rank=rank,
    )
    fused_counts, fused_width = torch.zeros(MAX_ROWS, dtype=torch.int64, device=device), None
    torch.cuda.synchronize()
    dist.barrier()
    rows = []
    for tokens, hidden in SHAPES:
        n = tokens * hidden
        x = torch.randn(n, device=device, dtype=torch.bfloat16) * (rank + 1)
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        expected = all_reduce_ref(parts)
        got = one_shot_all_reduce(x, buffers, pads, rank)
        torch.cuda.synchronize()
        exact = torch.equal(got, expected)
        nccl_buf = x.clone()
        peer_in = torch_in[:n]
        peer_in.copy_(x)
        calls = {
            "nccl": lambda b=nccl_buf: dist.all_reduce(b),
            "torch_symm_mem_one_shot": lambda b=peer_in: torch.ops.symm_mem.one_shot_all_reduce(
                b, "sum", GROUP
            ),
            "atom_one_shot": lambda b=x: one_shot_all_reduce(b, buffers, pads, rank),
        }
        if args.sweep:  # other tiles and grids (the default: see one_shot_all_reduce)
            for block, programs in ((256, None), (1024, None), (2048, None), (512, 64), (2048, 64)):
                calls[f"atom_block_{block}_programs_{programs or 'auto'}"] = lambda b=x, k=block, p=programs: (
                    one_shot_all_reduce(b, buffers, pads, rank, block=k, programs=p)
                )
        fused_exact = None
        if tokens <= MAX_ROWS:  # with the residual add and RMSNorm after it
            if hidden != fused_width:  # every call on the fused buffers has one width: start them afresh
                fused_counts.zero_()
                fused.zero_()
                torch.cuda.synchronize()
                dist.barrier()
                fused_width = hidden
            norm_calls, fused_exact = _with_norm(
                x.view(tokens, hidden), nccl_buf, dict(fused_args, counts=fused_counts), buffers, pads, rank
            )
            calls.update(norm_calls)
        times = {name: graph_time_us(call) for name, call in calls.items()}
        nbytes = n * 2
        bus = {k: 2 * (world - 1) / world * nbytes / (t * 1e-6) / 1e9 for k, t in times.items()}
        rows.append(
            dict(
                tokens=tokens,
                hidden=hidden,
                bytes=nbytes,
                exact=exact,
                fused_exact=fused_exact,
                us=times,
                bus_gb_s=bus,
            )
        )
    if rank == 0:
        record = dict(
            device=f"{world}x {torch.cuda.get_device_name()}",
            date=datetime.date.today().isoformat(),
            calls_per_graph=CALLS,
            rows=rows,
        )
        print(f"\n{record['device']}: all-reduce of bf16 [tokens, hidden], us per call (CUDA graph)")
        print(
            f"{'tokens':>6} {'hidden':>6} {'KB':>6} {'NCCL':>7} {'torch 1-shot':>12} {'ATOM 1-shot':>11} "
            f"{'x NCCL':>7} {'ATOM GB/s':>9} {'exact':>5}"
        )
        for r in rows:
            t = r["us"]
            print(
                f"{r['tokens']:>6} {r['hidden']:>6} {r['bytes'] / 1024:>6.0f} {t['nccl']:>7.2f} "
                f"{t['torch_symm_mem_one_shot']:>12.2f} {t['atom_one_shot']:>11.2f} "
                f"{t['nccl'] / t['atom_one_shot']:>7.2f} {r['bus_gb_s']['atom_one_shot']:>9.1f} {r['exact']!s:>5}"
            )
        print("\nwith the residual add and RMSNorm after it, us per call (CUDA graph)")
        print(
            f"{'tokens':>6} {'hidden':>6} {'NCCL+norm':>9} {'1-shot+norm':>11} {'fused':>7} "
            f"{'x 1-shot+norm':>13} {'x NCCL+norm':>11} {'exact':>5}"
        )
        for r in rows:
            t = r["us"]
            if "atom_fused_norm" in t:
                print(
                    f"{r['tokens']:>6} {r['hidden']:>6} {t['nccl+norm']:>9.2f} {t['atom_one_shot+norm']:>11.2f} "
                    f"{t['atom_fused_norm']:>7.2f} {t['atom_one_shot+norm'] / t['atom_fused_norm']:>13.2f} "
                    f"{t['nccl+norm'] / t['atom_fused_norm']:>11.2f} {r['fused_exact']!s:>5}"
                )
        if args.sweep:
            for r in rows:
                sweep = {
                    k[len("atom_") :]: round(v, 2) for k, v in r["us"].items() if k.startswith("atom_block")
                }
                print(f"  tokens {r['tokens']} hidden {r['hidden']}: {sweep}")
    dist.barrier()
    dist.destroy_process_group()
    return record if rank == 0 else None


if __name__ == "__main__":
    main()
