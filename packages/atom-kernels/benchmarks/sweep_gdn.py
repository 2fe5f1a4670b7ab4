"""GDN chunked-prefill sweep (how gdn_tiles was chosen): one sequence, H=32, D=128, bf16, T=8k and 32k.

  python -m benchmarks run sweep_gdn

Per GdnTiles variant: median ms, and the output's and final state's error against the same kernels on fp32
activations (3-pass TF32 throughout), next to flash-linear-attention's error against that same fp32 result
when fla is importable. Then where the time goes: CUDA time per kernel (torch.profiler) for the default
tiles and for fla.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import torch
import triton

from atom_kernels.gdn import gated_delta_rule_chunked, gdn_tiles
from benchmarks.harness.gdn_cases import DEV, D, H, fla_chunk, inputs

BASE = gdn_tiles(torch.bfloat16, D)
VARIANTS = {
    "default": BASE,
    "fp32 operands (TF32)": dataclasses.replace(BASE, lowp=False),
    "state value block 16": dataclasses.replace(BASE, state_block_v=16),
    "state value block 64": dataclasses.replace(BASE, state_block_v=64, state_warps=8),
    "state 2 warps": dataclasses.replace(BASE, state_warps=2),
    "state 8 warps": dataclasses.replace(BASE, state_warps=8),
    "state value block 16, 2 warps": dataclasses.replace(BASE, state_block_v=16, state_warps=2),
    "state 2 stages": dataclasses.replace(BASE, state_stages=2),
    "state 4 stages": dataclasses.replace(BASE, state_stages=4),
    "state value block 16, 4 stages": dataclasses.replace(BASE, state_block_v=16, state_stages=4),
    "output 128-wide, 8 warps": dataclasses.replace(BASE, out_block_v=128, out_warps=8),
    "prepare 8 warps": dataclasses.replace(BASE, prepare_warps=8),
    "inverse tf32x3 (3 passes)": dataclasses.replace(BASE, inverse_precision="tf32x3"),
    "prepare 2 warps": dataclasses.replace(BASE, prepare_warps=2),
}


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def kernel_times(fn, label):
    """CUDA time per kernel name over 10 calls, in us per call."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    print(f"\n{label}: CUDA time per call by kernel")
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = 0.0
    for e in sorted(events, key=lambda e: -e.device_time_total):
        us = e.device_time_total / 10
        total += us
        print(f"  {us:9.1f} us  {e.key[:90]}")
    print(f"  {total:9.1f} us  total")


def main():
    chunk_fla = fla_chunk()
    for tokens in (8192, 32768):
        q, k, v, g, beta = inputs(tokens)
        cu = torch.tensor([0, tokens], device=DEV, dtype=torch.int32)
        idx = torch.zeros(1, device=DEV, dtype=torch.int32)
        fresh = torch.zeros(1, dtype=torch.bool, device=DEV)

        def run(tiles, q=q, k=k, v=v, beta=beta, g=g, cu=cu, idx=idx, fresh=fresh):
            state = torch.zeros(1, H, D, D, device=DEV)
            out = torch.empty_like(v)
            fn = partial(
                gated_delta_rule_chunked,
                q,
                k,
                v,
                g,
                beta,
                cu,
                state,
                idx,
                has_initial_state=fresh,
                out=out,
                tiles=tiles,
            )
            fn()
            return fn, out, state

        _, want, want_state = run(None, q.float(), k.float(), v.float(), beta.float())
        print(f"\nT={tokens} H={H} D={D} bf16")
        print(f"{'variant':44} {'ms':>8} {'out err':>8} {'state err':>9}")
        for name, tiles in VARIANTS.items():
            fn, out, state = run(tiles)
            ms = triton.testing.do_bench(fn, return_mode="median")
            print(
                f"{name:44} {ms:8.3f} {rel(out, want):8.1e} {rel(state[0], want_state[0]):9.1e}", flush=True
            )
        if chunk_fla is not None:
            fla = partial(
                chunk_fla,
                q[None],
                k[None],
                v[None],
                g[None],
                beta[None],
                use_qk_l2norm_in_kernel=True,
                output_final_state=True,
            )
            out, final = fla()
            ms = triton.testing.do_bench(fla, return_mode="median")
            err = rel(final[0].transpose(-1, -2), want_state[0])
            print(f"{'flash-linear-attention':44} {ms:8.3f} {rel(out[0], want):8.1e} {err:9.1e}")
        kernel_times(run(BASE)[0], f"ATOM default T={tokens}")
        if chunk_fla is not None:
            kernel_times(fla, f"fla T={tokens}")


if __name__ == "__main__":
    main()
