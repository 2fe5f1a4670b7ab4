"""Tiles of the recurrent GDN decode kernel on the GPU: B sequences, HV=32, D=128, fp32 state (the
bytes: state read and written, q/k/v/o), each variant checked against the default's output first.

  python -m benchmarks run sweep_gdn_decode [-- --batches 1 8 64 256]

Small batches take small value blocks (more programs to spread one sequence's state over the SMs).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import triton

from atom_kernels.gdn import gated_delta_rule_recurrent
from benchmarks.harness.ceilings import measure_ceilings

DEV = torch.device("cuda")
H, D = 32, 128


def _tiles(batch: int) -> list[tuple[int, int]]:
    """(block_v, warps): below 64 sequences, value blocks down to one row a program."""
    blocks = (1, 2, 4, 8, 16) if batch < 64 else (8, 16, 32, 64)
    return [(block_v, warps) for block_v in blocks for warps in (1, 2, 4, 8) if warps * 32 <= block_v * D]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    args = parser.parse_args()
    copy_bw, _ = measure_ceilings(DEV)
    print(f"copy {copy_bw / 1e12:.2f} TB/s")
    print(f"{'B':>4} {'block_v':>7} {'warps':>5} {'us':>7} {'TB/s':>6} {'% copy':>7}")
    for batch in args.batches:
        torch.manual_seed(0)
        q, k, v = (torch.randn(batch, H, D, device=DEV, dtype=torch.bfloat16) for _ in range(3))
        g = torch.nn.functional.logsigmoid(torch.randn(batch, H, device=DEV)) * 0.1
        beta = torch.rand(batch, H, device=DEV, dtype=torch.bfloat16)
        state = torch.randn(batch + 8, H, D, D, device=DEV) * 0.01  # never written: each use clones it
        work = state.clone()  # what the timed replays update in place
        idx = torch.randperm(batch + 8, device=DEV)[:batch].to(torch.int32)
        cu = torch.arange(batch + 1, device=DEV, dtype=torch.int32)
        nbytes = 2 * batch * H * D * D * 4 + 4 * batch * H * D * 2
        want = gated_delta_rule_recurrent(q, k, v, g, beta, cu, state.clone(), idx)
        for block_v, warps in _tiles(batch):
            run = partial(
                gated_delta_rule_recurrent,
                q,
                k,
                v,
                g,
                beta,
                cu,
                work,
                idx,
                block_v=block_v,
                num_warps=warps,
            )
            got = gated_delta_rule_recurrent(
                q, k, v, g, beta, cu, state.clone(), idx, block_v=block_v, num_warps=warps
            )
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
            ms = triton.testing.do_bench_cudagraph(run, rep=100, return_mode="median")
            tb_s = nbytes / ms / 1e9
            print(
                f"{batch:>4} {block_v:>7} {warps:>5} {ms * 1e3:>7.1f} {tb_s:>6.2f} {100 * tb_s * 1e12 / copy_bw:>6.1f}%"
            )


if __name__ == "__main__":
    main()
