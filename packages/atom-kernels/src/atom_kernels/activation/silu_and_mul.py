"""SiLU-and-mul for gated MLPs: one read of [T, 2I], one write of [T, I]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.activation.ref import silu_and_mul_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, inter, stride_x, stride_out, BLOCK: tl.constexpr, PDL: tl.constexpr):
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2^31 elements
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(
    x: torch.Tensor, out: torch.Tensor | None = None, backend: Backend | str | None = None
) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:].

    x: [T, 2*I] (rows may be strided, the last dim must be contiguous); out: [T, I], same dtype.
    Returns out.
    """
    if x.dim() != 2 or x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul expects x of shape [T, 2*I], got {tuple(x.shape)}")
    if x.stride(-1) != 1:
        raise ValueError("silu_and_mul needs x's last dimension contiguous")
    tokens, inter = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    elif out.shape != (tokens, inter) or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be [{tokens}, {inter}] {x.dtype} with a contiguous last dim")
    if resolve_backend(backend, x.device) is Backend.TORCH:
        return out.copy_(silu_and_mul_ref(x))
    if tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    grid = (tokens, triton.cdiv(inter, block))
    pdl = pdl_launch(x.device)
    _silu_and_mul_kernel[grid](
        x, out, inter, x.stride(0), out.stride(0), BLOCK=block, PDL=pdl, launch_pdl=pdl,
    )  # fmt: skip
    return out
