"""GDN gating in one pass: g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b), per token and head."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.gdn.ref import gdn_gating_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def gate_values(a_log_ptr, a_ptr, dt_bias_ptr, b_ptr, t, h, ok, stride_a, stride_b):
    """g (fp32) and beta (rounded to b's dtype, as gdn_gating stores it) of token t, heads h (a scalar or
    a block, masked by ok): the one formula both the gating kernel and the fused recurrent step use."""
    x = tl.load(a_ptr + t * stride_a + h, mask=ok, other=0.0).to(tl.float32)
    x = x + tl.load(dt_bias_ptr + h, mask=ok, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's threshold: linear past 20
    g = -tl.exp(tl.load(a_log_ptr + h, mask=ok, other=0.0).to(tl.float32)) * softplus
    b = tl.load(b_ptr + t * stride_b + h, mask=ok, other=0.0).to(tl.float32)
    beta = (1.0 / (1.0 + tl.exp(-b))).to(b_ptr.dtype.element_ty)
    return g, beta


@triton.jit
def _gating_kernel(
    a_log_ptr,
    a_ptr,
    dt_bias_ptr,
    b_ptr,
    g_ptr,
    beta_ptr,
    heads,
    stride_a,
    stride_b,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    wait_for_inputs(PDL)  # a and b are the step's projections
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    ok = h < heads
    g, beta = gate_values(a_log_ptr, a_ptr, dt_bias_ptr, b_ptr, t, h, ok, stride_a, stride_b)
    tl.store(g_ptr + t * heads + h, g, mask=ok)
    tl.store(beta_ptr + t * heads + h, beta.to(beta_ptr.dtype.element_ty), mask=ok)


def check_gating(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor) -> None:
    """ValueError unless a, b are [T, HV] with a contiguous last dim and A_log, dt_bias [HV]."""
    if a.dim() != 2 or b.shape != a.shape or A_log.shape != (a.shape[1],) or dt_bias.shape != (a.shape[1],):
        raise ValueError(
            f"gdn_gating expects a, b [T, HV] and A_log, dt_bias [HV]; got {tuple(a.shape)}, {tuple(b.shape)}, "
            f"{tuple(A_log.shape)}, {tuple(dt_bias.shape)}"
        )
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("gdn_gating needs the last dimension of a and b contiguous")


def gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    *,
    backend: Backend | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A_log, dt_bias: [HV]; a, b: [T, HV] (rows may be strided). Returns (g [T, HV] fp32, beta [T, HV] in
    b's dtype), as transformers' Qwen3-Next computes them."""
    check_gating(A_log, a, dt_bias, b)
    if resolve_backend(backend, a.device) is Backend.TORCH:
        return gdn_gating_ref(A_log, a, dt_bias, b)
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    if a.shape[0]:
        pdl = pdl_launch(a.device)
        _gating_kernel[(a.shape[0],)](
            A_log, a, dt_bias, b, g, beta, a.shape[1], a.stride(0), b.stride(0),
            BLOCK_H=triton.next_power_of_2(a.shape[1]), PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
    return g, beta
