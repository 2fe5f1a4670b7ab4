"""Warps and tiles of a decode step's small per-token kernels, as CUDA-graph replays (microseconds per call).

  python -m benchmarks run sweep_small_kernels

- routing, one program per token, at 1, 64 and 4096 tokens: topk_softmax (E=128, k=8: Qwen3-30B-A3B) and
  grouped_topk (E=256 in 8 groups of which 4 kept, k=8, bias: DeepSeek-V3); ids checked equal across
  warp counts;
- the residual RMSNorm at 1 and 64 tokens of 2048-7168 columns;
- the split-KV combine of paged decode (one program per token and q head; 32 heads of 128, 8-64 splits)
  and the MoE top-k combine (k=8 rows of 2048 / 7168 per token, columns per program and warps), outputs
  checked against the first variant's.
"""

from __future__ import annotations

from functools import partial

import torch
import triton

from atom_kernels.attention.packs import Partials
from atom_kernels.attention.tile_kernel import combine_splits_kernel
from atom_kernels.moe.combine import _combine_kernel
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
        PDL=False, num_warps=warps,
    )  # fmt: skip


def grouped_topk_call(logits, bias, w, ids, warps):
    _grouped_topk_kernel[(logits.shape[0],)](
        logits, bias, w, ids, logits.stride(0), 2.5, GROUPS=8, GROUP_SIZE=32, TOPK_GROUPS=4, TOP_K=8,
        BLOCK_K=8, HAS_BIAS=True, SIGMOID=True, RENORMALIZE=True, PDL=False, num_warps=warps,
    )  # fmt: skip


def rms_norm_call(x, r, g, o, ro, warps):
    _rms_norm_kernel[(x.shape[0],)](
        x, r, g, o, ro, x.shape[1], 1e-6, 0.0, x.stride(0), r.stride(0), o.stride(0), ro.stride(0),
        HAS_RESIDUAL=True, BLOCK=triton.next_power_of_2(x.shape[1]), PDL=False, num_warps=warps,
    )  # fmt: skip


def combine_splits_call(part_o, part_lse, out, splits, warps):
    combine_splits_kernel[(out.shape[0], out.shape[1])](
        Partials(part_o, part_lse), out, part_lse, out.stride(0), out.stride(1), out.shape[1], NUM_SPLITS=splits,
        HAS_SINKS=False, HEAD_DIM=out.shape[2], BLOCK_S=triton.next_power_of_2(splits),
        BLOCK_D=triton.next_power_of_2(out.shape[2]), PDL=False, num_warps=warps,
    )  # fmt: skip


def moe_combine_call(y, out, block_h, warps):
    grid = (out.shape[0], triton.cdiv(out.shape[1], block_h))
    _combine_kernel[grid](
        y, out, out.shape[1], out.stride(0), TOP_K=8, BLOCK_H=block_h, PDL=False, num_warps=warps
    )


def checked_row(name: str, variants: dict, out: torch.Tensor) -> None:
    """Time each variant (a call) after checking its output against the first's (fp32 sums in another
    order round differently in the last bf16 place)."""
    cells, first = [], None
    for label, call in variants.items():
        out.fill_(float("nan"))
        call()
        first = out.clone() if first is None else first
        torch.testing.assert_close(out, first, rtol=1e-2, atol=1e-2, msg=f"{name}: {label} differs")
        cells.append(f"{label} {graph_us(call):6.2f}")
    print(f"{name}: " + "  ".join(cells), flush=True)


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
    for splits in (8, 16, 64):
        part_o = torch.randn(32 * splits, 128, device=dev)
        part_lse = torch.randn(32 * splits, device=dev)
        out = torch.empty(1, 32, 128, device=dev, dtype=torch.bfloat16)
        variants = {
            f"w{w}": partial(combine_splits_call, part_o, part_lse, out, splits, w) for w in (1, 2, 4, 8)
        }
        checked_row(f"combine_splits T=1 Hq=32 D=128 splits={splits} (default w4)", variants, out)
    for hidden in (2048, 7168):
        for tokens in (1, 64):
            y = torch.randn(tokens * 8, hidden, device=dev, dtype=torch.bfloat16)
            out = torch.empty(tokens, hidden, device=dev, dtype=torch.bfloat16)
            variants = {
                f"h{bh}w{w}": partial(moe_combine_call, y, out, bh, w)
                for bh in (256, 512, 1024)
                for w in (1, 2, 4)
            }
            checked_row(f"moe combine k=8 H={hidden} T={tokens} (default h1024w4)", variants, out)


if __name__ == "__main__":
    main()
