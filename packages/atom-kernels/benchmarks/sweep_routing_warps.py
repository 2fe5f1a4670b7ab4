"""Warps per program for the small per-token kernels of a decode step (routing, RMSNorm), as CUDA-graph replays.

  PYTHONPATH=packages/atom-kernels/src python3 packages/atom-kernels/benchmarks/sweep_routing_warps.py

One program per token; microseconds per call at 1, 64 and 4096 tokens for topk_softmax (E=128, k=8:
Qwen3-30B-A3B) and grouped_topk (E=256 in 8 groups of which 4 kept, k=8, bias: DeepSeek-V3), and for the
residual RMSNorm at 1 and 64 tokens of 2048-7168 columns. The ids are checked equal across warp counts.
"""

from __future__ import annotations

from functools import partial

import torch
import triton

from atom_kernels.moe.routing import _grouped_topk_kernel, _topk_softmax_kernel
from atom_kernels.norm.rms_norm import _rms_norm_kernel

WARPS = (1, 2, 4)


def graph_us(fn, reps: int = 50) -> float:
    """Best of seven replays of `reps` calls captured in one graph, microseconds per call."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best * 1000


def topk_softmax_call(logits, w, ids, warps):
    _topk_softmax_kernel[(logits.shape[0],)](
        logits, w, ids, 128, logits.stride(0), TOP_K=8, RENORMALIZE=True, ROUND_TO=1, BLOCK_E=128, BLOCK_K=8,
        num_warps=warps,
    )  # fmt: skip


def grouped_topk_call(logits, bias, w, ids, warps):
    _grouped_topk_kernel[(logits.shape[0],)](
        logits, bias, w, ids, logits.stride(0), 2.5, GROUPS=8, GROUP_SIZE=32, TOPK_GROUPS=4, TOP_K=8,
        BLOCK_K=8, HAS_BIAS=True, SIGMOID=True, RENORMALIZE=True, num_warps=warps,
    )  # fmt: skip


def rms_norm_call(x, r, g, o, ro, warps):
    _rms_norm_kernel[(x.shape[0],)](
        x, r, g, o, ro, x.shape[1], 1e-6, 0.0, x.stride(0), r.stride(0), o.stride(0), ro.stride(0),
        HAS_RESIDUAL=True, BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=warps,
    )  # fmt: skip


def routing_row(name: str, call, ids: torch.Tensor) -> None:
    cells, first = [], None
    for warps in WARPS:
        call(warps=warps)
        first = ids.clone() if first is None else first
        assert torch.equal(ids, first), f"{name}: other experts with {warps} warps"
        cells.append(f"w{warps} {graph_us(partial(call, warps=warps)):6.2f}")
    print(f"{name}: " + "  ".join(cells), flush=True)


def main() -> None:
    dev = "cuda"
    for tokens in (1, 64, 4096):
        w = torch.empty(tokens, 8, device=dev)
        ids = torch.empty(tokens, 8, device=dev, dtype=torch.int32)
        logits = torch.randn(tokens, 128, device=dev, dtype=torch.bfloat16)
        routing_row(f"topk_softmax E=128 k=8 T={tokens}", partial(topk_softmax_call, logits, w, ids), ids)
        logits = torch.randn(tokens, 256, device=dev)
        bias = torch.randn(256, device=dev)
        routing_row(
            f"grouped_topk E=256 k=8 T={tokens}", partial(grouped_topk_call, logits, bias, w, ids), ids
        )
    for hidden in (2048, 4096, 7168):
        for tokens in (1, 64):
            x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
            args = (x, torch.randn_like(x), torch.rand(hidden, device=dev, dtype=torch.bfloat16))
            outs = (torch.empty_like(x), torch.empty_like(x))
            cells = [
                f"w{n} {graph_us(partial(rms_norm_call, *args, *outs, n)):6.2f}" for n in (1, 2, 4, 8, 16)
            ]
            default = min(16, max(1, triton.next_power_of_2(hidden) // 256))
            print(f"rms_norm+res H={hidden} T={tokens} (default w{default}): " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
