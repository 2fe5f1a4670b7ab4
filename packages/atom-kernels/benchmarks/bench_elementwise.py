"""Memory-bound per-token ops at T=16k (docs/architecture.md §7): RMSNorm (+residual, gated), SiLU-and-mul, RoPE, MRoPE.

  python -m benchmarks run elementwise

Per op: median time (triton.testing.do_bench), bytes moved / time in TB/s, % of the copy bandwidth
measured in this run, and the ratio to the same math in eager torch (the reference functions) measured
in this run on the same data. A table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import torch
import triton

from atom_kernels import apply_mrope, apply_rotary, rms_norm, rms_norm_gated, silu_and_mul
from atom_kernels.activation.ref import silu_and_mul_ref
from atom_kernels.norm.ref import rms_norm_gated_ref, rms_norm_ref
from atom_kernels.rotary.ref import apply_mrope_ref, apply_rotary_ref
from benchmarks.harness.ceilings import measure_ceilings

DEV = torch.device("cuda")
T, H = 16384, 4096


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    parser = argparse.ArgumentParser()
    parser.parse_args()
    bf16 = dict(device=DEV, dtype=torch.bfloat16)
    copy_bw, _ = measure_ceilings(DEV)
    rows = []

    def add(op, shape, nbytes, fn, base):
        ms, base_ms = bench(fn), bench(base)
        tbs = nbytes / (ms * 1e-3) / 1e12
        rows.append(
            dict(
                op=op,
                shape=shape,
                ms=ms,
                tb_s=tbs,
                pct_copy=100 * tbs * 1e12 / copy_bw,
                torch_ms=base_ms,
                x_torch=base_ms / ms,
            )
        )

    x, r, w = torch.randn(T, H, **bf16), torch.randn(T, H, **bf16), torch.rand(H, **bf16)
    out = torch.empty_like(x)
    add(
        "rms_norm",
        f"{T}x{H}",
        2 * T * H * 2,
        partial(rms_norm, x, w, 1e-6, out=out),
        partial(rms_norm_ref, x, w, 1e-6),
    )
    add(
        "rms_norm + residual",
        f"{T}x{H}",
        4 * T * H * 2,
        partial(rms_norm, x, w, 1e-6, r, out=out),
        partial(rms_norm_ref, x, w, 1e-6, r),
    )
    heads = torch.randn(T * 32, 128, **bf16)  # GDN output: 32 value heads of 128 per token
    head_gate, head_w = torch.randn(T * 32, 128, **bf16), torch.rand(128, **bf16)
    add(
        "rms_norm_gated (GDN)",
        f"{T}x32 heads x128",
        3 * heads.numel() * 2,
        partial(rms_norm_gated, heads, head_gate, head_w, 1e-6),
        partial(rms_norm_gated_ref, heads, head_gate, head_w, 1e-6),
    )
    del heads, head_gate
    gate_up = torch.randn(T, 2 * H, **bf16)
    act = torch.empty(T, H, **bf16)
    add(
        "silu_and_mul",
        f"{T}x2*{H}",
        3 * T * H * 2,
        partial(silu_and_mul, gate_up, act),
        partial(silu_and_mul_ref, gate_up),
    )
    for name, hq, hkv, d, rot in (
        ("rope (Llama-3 8B)", 32, 8, 128, 128),
        ("rope partial, head 256 rot 64", 16, 2, 256, 64),
    ):
        qkv = torch.randn(T, (hq + 2 * hkv) * d, **bf16)
        q = qkv[:, : hq * d].view(T, hq, d)
        k = qkv[:, hq * d : (hq + hkv) * d].view(T, hkv, d)
        pos = torch.randint(0, 32768, (T,), device=DEV)
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, rot, 2, device=DEV).float() / rot))
        moved = 2 * T * (hq + hkv) * rot * 2  # the rotated part of q and k, read and written in place
        add(
            name,
            f"T={T} q{hq}/k{hkv}x{d} rot {rot}",
            moved,
            partial(apply_rotary, pos, q, k, inv_freq, rotary_dim=rot),
            partial(apply_rotary_ref, pos, q, k, inv_freq, rotary_dim=rot),
        )
    for name, hq, hkv, d, rot, section, interleaved in (
        ("mrope chunked (Qwen2.5-VL 7B)", 28, 4, 128, 128, (16, 24, 24), False),
        ("mrope interleaved (Qwen3.5)", 16, 2, 256, 64, (11, 11, 10), True),
    ):
        qkv = torch.randn(T, (hq + 2 * hkv) * d, **bf16)
        q = qkv[:, : hq * d].view(T, hq, d)
        k = qkv[:, hq * d : (hq + hkv) * d].view(T, hkv, d)
        pos = torch.randint(0, 32768, (3, T), device=DEV)
        inv_freq = 1.0 / (1e7 ** (torch.arange(0, rot, 2, device=DEV).float() / rot))
        moved = 2 * T * (hq + hkv) * rot * 2 + pos.numel() * pos.element_size()
        kw = dict(rotary_dim=rot, section=section, interleaved=interleaved)
        add(
            name,
            f"T={T} q{hq}/k{hkv}x{d} rot {rot}",
            moved,
            partial(apply_mrope, pos, q, k, inv_freq, **kw),
            partial(apply_mrope_ref, pos, q, k, inv_freq, **kw),
        )
    record = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        triton=triton.__version__,
        copy_tb_s=copy_bw / 1e12,
        rows=rows,
    )
    print(f"\n{record['device']}  copy {record['copy_tb_s']:.2f} TB/s")
    print(f"{'op':28} {'shape':34} {'ms':>8} {'TB/s':>6} {'% copy':>7} {'torch ms':>9} {'x torch':>8}")
    for r_ in rows:
        print(
            f"{r_['op']:28} {r_['shape']:34} {r_['ms']:8.3f} {r_['tb_s']:6.2f} {r_['pct_copy']:6.1f}% "
            f"{r_['torch_ms']:9.3f} {r_['x_torch']:8.2f}"
        )
    return record


if __name__ == "__main__":
    main()
