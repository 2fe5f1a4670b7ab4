"""Gated RMSNorm of gated-delta-net outputs: rmsnorm(x) * weight * silu(gate) per row (a head), one pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.norm.ref import rms_norm_gated_ref
from atom_kernels.outputs import rows_like
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _rms_norm_gated_kernel(
    x_ptr,
    gate_ptr,
    w_ptr,
    out_ptr,
    rows,
    dim,
    eps,
    stride_x,
    stride_g,
    stride_out,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    # Rows are short (a head, 64-256 wide): BLOCK_R of them per program keep enough bytes in flight.
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (r < rows) & (d < dim)
    w = tl.load(w_ptr + d, mask=d < dim, other=0.0)  # a constant: read before PDL's wait
    wait_for_inputs(PDL)
    x = tl.load(x_ptr + r * stride_x + d, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / dim + eps)
    normed = (x * inv[:, None]).to(x_ptr.dtype.element_ty)
    y = (w * normed).to(tl.float32)  # rounded in the weight/activation promotion, as transformers does
    g = tl.load(gate_ptr + r * stride_g + d, mask=mask, other=0.0).to(tl.float32)
    y = y * (g / (1.0 + tl.exp(-g)))
    tl.store(out_ptr + r * stride_out + d, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_gated(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """(weight * rmsnorm(x)) * silu(gate) per row.

    x, gate: [N, D] (N = tokens * value heads; rows may be strided, last dim contiguous), one shape;
    weight: [D]. Returns out [N, D] in x's dtype.
    """
    if x.dim() != 2 or gate.shape != x.shape or weight.shape != (x.shape[1],):
        raise ValueError(
            f"rms_norm_gated expects x and gate [N, D] and weight [D], got {tuple(x.shape)}, "
            f"{tuple(gate.shape)} and {tuple(weight.shape)}"
        )
    if x.stride(-1) != 1 or gate.stride(-1) != 1:
        raise ValueError("rms_norm_gated needs the last dimension of x and gate contiguous")
    rows, dim = x.shape
    out = rows_like(x, out)
    if resolve_backend(backend, x.device) is Backend.TORCH:
        return out.copy_(rms_norm_gated_ref(x, gate, weight, eps))
    if rows:
        block_d = triton.next_power_of_2(dim)
        block_r = max(1, min(64, 4096 // block_d))
        pdl = pdl_launch(x.device)
        _rms_norm_gated_kernel[(triton.cdiv(rows, block_r),)](
            x, gate, weight, out, rows, dim, eps, x.stride(0), gate.stride(0), out.stride(0), BLOCK_R=block_r,
            BLOCK_D=block_d, PDL=pdl, num_warps=4, launch_pdl=pdl,
        )  # fmt: skip
    return out
