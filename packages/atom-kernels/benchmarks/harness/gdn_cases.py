"""GDN inputs and the flash-linear-attention baseline the GDN benchmarks share."""

from __future__ import annotations

import torch

DEV = torch.device("cuda")
H, D = 32, 128


def inputs(tokens, heads=H):
    torch.manual_seed(0)
    q = torch.randn(tokens, heads, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(tokens, heads, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(tokens, heads, D, device=DEV, dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(tokens, heads, device=DEV)) * 0.1  # log decay <= 0
    beta = torch.rand(tokens, heads, device=DEV, dtype=torch.bfloat16)
    return q, k, v, g, beta


def kernel_ms(fn, calls: int = 5) -> float:
    """GPU time of fn's kernels per call (host work and launch gaps excluded)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages()) / calls / 1e3


def fla_op(name: str):
    """flash-linear-attention's gated delta rule op `name` (chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule), or None where the package is not importable (the table says so)."""
    try:
        from fla.ops import gated_delta_rule
    except Exception as exc:  # not installed on this machine
        print(f"flash-linear-attention not importable ({type(exc).__name__}: {exc}); no baseline")
        return None
    return getattr(gated_delta_rule, name)


def fla_chunk():
    return fla_op("chunk_gated_delta_rule")
