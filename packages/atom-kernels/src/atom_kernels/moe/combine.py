"""The MoE combine: each token's k expert outputs (already scaled by their routing weights in the down GEMM)
summed into one row, with the block's shared expert's term if it has one (shared.py).

torch's generic reduction over the [T, k, H] view costs a launch and a tree reduce a layer at decode's one
token (32 KB); here one program reads a column block of a token's k rows with all
its loads in flight at once, adds them in fp32 in pair order and rounds once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.moe.shared import SharedExpert
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs

# Columns per program: at decode's few tokens more, smaller programs finish sooner (k=8,
# benchmarks/sweep_small_kernels.py: ahead of 1024 at one token and at 64 tokens for H=2048, even at 7168)
_BLOCK_H = 256


@triton.jit
def _combine_kernel(
    y_ptr,
    out_ptr,
    shared_ptr,
    gate_ptr,
    hidden,
    stride_out,
    stride_shared,
    stride_gate,
    TOP_K: tl.constexpr,
    SHARED: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < hidden
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (token * TOP_K + j) * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    if SHARED:  # the shared expert's row, scaled by its gate's sigmoid
        term = tl.load(shared_ptr + token * stride_shared + cols, mask=mask, other=0.0).to(tl.float32)
        if GATED:
            logit = tl.load(gate_ptr + token * stride_gate).to(tl.float32)
            term = term / (1.0 + tl.exp(-logit))
        acc += term
    tl.store(out_ptr + token * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def combine_topk(
    y: torch.Tensor, top_k: int, out: torch.Tensor, shared: SharedExpert | None = None
) -> torch.Tensor:
    """y: [T * k, H] contiguous, row t * k + j token t's j-th expert output -> out [T, H] (last dim
    contiguous, y's dtype) = sum over j, accumulated in fp32 in j order, plus the shared expert's term
    (shared.py). Triton (GPU or the interpreter); the caller picks the backend. Returns out."""
    rows, hidden = y.shape
    tokens = rows // top_k
    if rows != tokens * top_k or tuple(out.shape) != (tokens, hidden) or out.stride(-1) != 1:
        raise ValueError(
            f"combine_topk expects y [T * {top_k}, H] and out [T, H], got {tuple(y.shape)} and {tuple(out.shape)}"
        )
    if not y.is_contiguous():
        raise ValueError("combine_topk expects y contiguous")
    if shared is not None:
        shared.check(tokens, hidden)
    if tokens == 0:
        return out
    block_h = min(_BLOCK_H, triton.next_power_of_2(hidden))
    grid = (tokens, triton.cdiv(hidden, block_h))
    pdl = pdl_launch(y.device)
    term = y if shared is None else shared.out
    gate = term if shared is None or shared.gate is None else shared.gate.reshape(-1)
    _combine_kernel[grid](
        y, out, term, gate, hidden, out.stride(0), term.stride(0), gate.stride(0), TOP_K=top_k,
        SHARED=shared is not None, GATED=shared is not None and shared.gate is not None, BLOCK_H=block_h,
        PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
    return out
