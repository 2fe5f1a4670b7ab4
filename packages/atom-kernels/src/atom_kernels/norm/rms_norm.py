"""RMSNorm in one pass per row: optional residual add, fp32 statistics, weight multiply, and the new residual."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.norm.ref import rms_norm_ref
from atom_kernels.outputs import rows_like
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    hidden,
    eps,
    weight_offset,
    stride_x,
    stride_res,
    stride_out,
    stride_res_out,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # a constant: before the wait
    wait_for_inputs(PDL)
    s = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # rounded like x + residual
        tl.store(res_out_ptr + row * stride_res_out + cols, s, mask=mask)
    sf = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / hidden + eps)
    normed = (sf * inv).to(x_ptr.dtype.element_ty).to(tl.float32)
    if weight_offset != 0.0:
        w = (w + weight_offset).to(w_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    weight_offset: float = 0.0,
    out: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of each row: (weight + weight_offset) * s / sqrt(mean(s^2) + eps), s = x (+ residual).

    x, residual: [T, H] (rows may be strided, last dim contiguous), one dtype; weight: [H].
    weight_offset=1.0 is Gemma's (1 + weight). Returns out [T, H], or (out, s) with a residual: s is the
    sum the next layer's residual continues from (a new tensor; x and residual are not modified). With
    PDL (pdl.py) `weight` is read before the previous kernel has finished: no kernel still in flight on
    the stream may write it.
    """
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"rms_norm expects x [T, H] and weight [H], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("rms_norm needs the last dimension of x and residual contiguous")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must be like x: {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)}")
    tokens, hidden = x.shape
    out = rows_like(x, out)
    if resolve_backend(backend, x.device) is Backend.TORCH:
        ref = rms_norm_ref(x, weight, eps, residual, weight_offset)
        if residual is None:
            return out.copy_(ref)
        out.copy_(ref[0])
        return out, ref[1]
    new_residual = torch.empty_like(out) if residual is not None else out
    if tokens:
        pdl = pdl_launch(x.device)
        _rms_norm_kernel[(tokens,)](
            x, residual if residual is not None else x, weight, out, new_residual, hidden, eps, weight_offset,
            x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
            new_residual.stride(0), HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
            PDL=pdl, num_warps=min(16, max(1, triton.next_power_of_2(hidden) // 256)), launch_pdl=pdl,
        )  # fmt: skip
    return out if residual is None else (out, new_residual)
