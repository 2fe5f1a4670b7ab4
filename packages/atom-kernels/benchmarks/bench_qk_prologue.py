"""The fused q/k norm + rotary + KV write (qk_norm_rope_write) at Qwen3.5's attention shape on the GPU,
beside the four unfused launches (rms_norm of q, of k, apply_rotary, write_kv) in the same run.

  python -m benchmarks run qk_prologue

Qwen3.5-35B-A3B per rank at TP=1: 16 q heads (inside the gated projection: q is a strided view), 2 KV
heads, head 256, rotary 64 of 256, zero-centred norms, bf16 flash cache. Bytes: q, k, v read, q written,
k and v written to the cache; GB/s and % of the copy bandwidth measured in this run (CUDA-graph medians).
"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import torch
import triton

from atom_kernels.cache import write_kv
from atom_kernels.norm import rms_norm
from atom_kernels.rotary import apply_rotary, qk_norm_rope_write
from benchmarks.harness.ceilings import measure_ceilings

DEV = torch.device("cuda")
HQ, HKV, D, ROTARY = 16, 2, 256, 64


def inputs(tokens: int):
    torch.manual_seed(0)
    packed = torch.randn(tokens, HQ * 2 * D + 2 * HKV * D, device=DEV, dtype=torch.bfloat16)
    q = packed[:, : HQ * 2 * D].view(tokens, HQ, 2 * D)[..., :D]
    k = packed[:, HQ * 2 * D : (HQ * 2 + HKV) * D].view(tokens, HKV, D)
    v = packed[:, (HQ * 2 + HKV) * D :].view(tokens, HKV, D)
    qw, kw = (torch.randn(D, device=DEV, dtype=torch.bfloat16) * 0.1 for _ in range(2))
    positions = torch.arange(tokens, device=DEV) + 100
    inv_freq = 1.0 / (1e7 ** (torch.arange(0, ROTARY, 2, device=DEV).float() / ROTARY))
    blocks = tokens // 16 + 2
    k_cache, v_cache = (torch.zeros(blocks, 16, HKV, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    slots = (
        torch.randperm(blocks * 16, device=DEV)[:tokens]
        if tokens <= 256
        else torch.arange(tokens, device=DEV)
    )
    return q, k, v, qw, kw, positions, inv_freq, k_cache, v_cache, slots


def unfused(q, k, v, qw, kw, positions, inv_freq, k_cache, v_cache, slots):
    tokens = q.shape[0]
    qn = rms_norm(q.reshape(-1, D), qw, 1e-6, weight_offset=1.0).view(tokens, HQ, D)
    kn = rms_norm(k.reshape(-1, D), kw, 1e-6, weight_offset=1.0).view(tokens, HKV, D)
    apply_rotary(positions, qn, kn, inv_freq, rotary_dim=ROTARY)
    write_kv(kn, v, k_cache, v_cache, slots)
    return qn


def main():
    parser = argparse.ArgumentParser()
    parser.parse_args()
    copy_bw, _ = measure_ceilings(DEV)
    rows = []
    for tokens in (1, 64, 4096, 16384):
        args_ = inputs(tokens)
        fused = partial(qk_norm_rope_write, *args_, eps=1e-6, rotary_dim=ROTARY, weight_offset=1.0)
        want = unfused(*args_)
        kc_want = args_[7].clone()
        got = fused()
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1.6e-2)
        torch.testing.assert_close(args_[7], kc_want, rtol=1.6e-2, atol=1.6e-2)
        nbytes = tokens * (2 * HQ + 4 * HKV) * D * 2
        row = dict(tokens=tokens, bytes=nbytes)
        for name, fn in (("fused", fused), ("unfused", partial(unfused, *args_))):
            ms = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
            row[f"{name}_us"] = ms * 1e3
            row[f"{name}_pct_copy"] = 100 * nbytes / (ms * 1e-3) / copy_bw
        row["speedup"] = row["unfused_us"] / row["fused_us"]
        rows.append(row)
    record = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        triton=triton.__version__,
        copy_tb_s=copy_bw / 1e12,
        shape=dict(q_heads=HQ, kv_heads=HKV, head_dim=D, rotary_dim=ROTARY),
        rows=rows,
    )
    print(
        f"{record['device']}  copy {copy_bw / 1e12:.2f} TB/s  Qwen3.5 attention prologue (16/2 heads, D=256)"
    )
    print(f"{'tokens':>7} {'fused us':>9} {'% copy':>7} {'unfused us':>11} {'% copy':>7} {'speed-up':>8}")
    for r in rows:
        print(
            f"{r['tokens']:>7} {r['fused_us']:>9.1f} {r['fused_pct_copy']:>6.1f}% {r['unfused_us']:>11.1f} "
            f"{r['unfused_pct_copy']:>6.1f}% {r['speedup']:>7.2f}x"
        )
    return record


if __name__ == "__main__":
    main()
