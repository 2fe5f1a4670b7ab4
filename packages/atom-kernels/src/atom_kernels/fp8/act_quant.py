"""Dynamic activation quantization: x [M, K] -> e4m3 values and one fp32 scale per token per `group` channels.
With gated_input, x is a gated MLP's [M, 2K] (gate | up) and silu(gate) * up is formed in the same pass, so
the down projection's input is read once and never written in x's dtype.

One program takes BLOCK_M rows of one group: it reads the tile once, reduces |x| per row, and writes the
e4m3 tile and the rows' scales. The arithmetic is quantize_act_ref's, operation for operation, with
IEEE-rounded divisions (Triton's plain `/` is the approximate one on NVIDIA), so on a GPU the result equals
the reference bit for bit.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from atom_kernels.activation.ref import silu_and_mul_ref
from atom_kernels.fp8.ref import ACT_EPS, E4M3, E4M3_MAX, quantize_act_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TILE_ELEMENTS = 4096  # elements per program: enough bytes in flight, few registers per thread
_EPS = tl.constexpr(ACT_EPS)  # jit functions read module globals only as constexprs
_MAX = tl.constexpr(E4M3_MAX)


@triton.jit
def _round_to_e4m3(v):
    """fp32 v with |v| <= 448 -> the nearest e4m3 value (ties to even), still in fp32. The conversion that
    follows is then exact everywhere: the CPU interpreter's own fp32 -> e4m3 rounds ties away from zero and
    loses the carry into the exponent (126.8 -> 64); the GPU's cvt.rn already rounds like this."""
    bits = v.to(tl.int32, bitcast=True)
    exp = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # below 2^-6 (subnormals) the step stays 2^-9
    up = ((127 + 3 - exp) << 23).to(tl.float32, bitcast=True)  # 2^(3 - exp): keep 3 mantissa bits
    down = ((127 - 3 + exp) << 23).to(tl.float32, bitcast=True)
    t = tl.abs(v) * up  # exact (a power of two), < 16
    t = (t + 12582912.0) - 12582912.0  # 1.5 * 2^23: the addition rounds t to an integer, ties to even
    # v's sign back on, so a negative value that rounds to zero is -0 as in torch
    return ((t * down).to(tl.int32, bitcast=True) | (bits & -0x80000000)).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_act_kernel(
    x_ptr,
    xq_ptr,
    xs_ptr,
    M,
    K,
    stride_x,
    stride_xq,
    stride_xs,  # between tokens' scales
    stride_xs_g,  # between a token's groups: 1 for [M, G] rows, M_pad for cuBLAS's token-major columns
    group,
    BLOCK_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
    POW2: tl.constexpr,
    GATED: tl.constexpr,  # x is [M, 2K], gate then up: quantize silu(gate) * up
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    g = tl.program_id(1)
    c = tl.arange(0, BLOCK_G)
    cols = g * group + c
    mask = (rm[:, None] < M) & (c[None, :] < group) & (cols[None, :] < K)  # the last group may be ragged
    rows = rm[:, None].to(tl.int64)
    wait_for_inputs(PDL)  # x is the previous kernel's output
    x = tl.load(x_ptr + rows * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if GATED:
        up = tl.load(x_ptr + rows * stride_x + K + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        # silu_and_mul's arithmetic, rounded to x's dtype as its output is: the same e4m3 values after
        x = (x / (1.0 + tl.exp(-x)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    xs = tl.math.div_rn(tl.maximum(amax, _EPS), _MAX)
    if POW2:
        # The next power of two up: carry any mantissa bit into the exponent (xs is a positive normal).
        bits = xs.to(tl.int32, bitcast=True)
        xs = ((bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
    q = _round_to_e4m3(tl.clamp(tl.math.div_rn(x, xs[:, None]), -_MAX, _MAX))
    tl.store(xq_ptr + rows * stride_xq + cols[None, :], q.to(xq_ptr.dtype.element_ty), mask=mask)
    tl.store(xs_ptr + rm.to(tl.int64) * stride_xs + g * stride_xs_g, xs, mask=rm < M)


def quantize_act(
    x: torch.Tensor,
    group: int,
    *,
    pow2_scales: bool = False,
    backend: Backend | str | None = None,
    token_major_scales: bool = False,
    pad_rows_to: int = 1,
    gated_input: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] fp16/bf16/fp32 -> (xq [M, K] e4m3, xs [M, ceil(K/group)] fp32), quantize_act_ref's result.
    With gated_input, x is [M, 2K] and what is quantized is silu_and_mul(x) (in x's dtype).

    Each token's channels are quantized in groups of `group` (the last one may be shorter):
    xs = max(absmax, 1e-4) / 448, rounded up to a power of two with pow2_scales, and xq = x / xs.
    token_major_scales stores xs with the tokens adjacent (strides (1, M)), the layout cuBLAS's blockwise
    scaling reads; pad_rows_to rounds M up (xq and xs get rows past M, left unwritten), for its alignment.
    The kernel runs on a GPU, or on the CPU interpreter when backend="triton" is passed; else torch.
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_act expects x [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"quantize_act expects x in float16, bfloat16 or float32, got {x.dtype}")
    if group < 1:
        raise ValueError(f"quantize_act expects a group of at least 1 channel, got {group}")
    if pad_rows_to < 1:
        raise ValueError(f"quantize_act expects pad_rows_to >= 1, got {pad_rows_to}")
    if gated_input and x.shape[1] % 2:
        raise ValueError(f"quantize_act with gated_input expects x [M, 2K], got shape {tuple(x.shape)}")
    chosen = resolve_backend(backend, x.device)
    m, k = x.shape[0], x.shape[1] // 2 if gated_input else x.shape[1]
    groups = math.ceil(k / group)
    m_pad = -(-m // pad_rows_to) * pad_rows_to
    on_torch = chosen is Backend.TORCH or not (x.is_cuda or backend is not None)
    if on_torch:
        x = silu_and_mul_ref(x) if gated_input else x
        if m_pad == m and not token_major_scales:
            return quantize_act_ref(x, group, pow2_scales=pow2_scales)
    xq = torch.empty(m_pad, k, dtype=E4M3, device=x.device)
    if token_major_scales:
        xs = torch.empty(groups, m_pad, dtype=torch.float32, device=x.device).t()
    else:
        xs = torch.empty(m_pad, groups, dtype=torch.float32, device=x.device)
    if on_torch:
        xq[:m], xs[:m] = quantize_act_ref(x, group, pow2_scales=pow2_scales)
        return xq, xs
    if m == 0 or k == 0:
        return xq, xs
    if x.stride(-1) != 1:
        x = x.contiguous()
    block_g = triton.next_power_of_2(group)
    block_m = max(1, min(triton.next_power_of_2(m), _TILE_ELEMENTS // block_g))
    grid = (triton.cdiv(m, block_m), groups)
    pdl = pdl_launch(x.device)
    _quantize_act_kernel[grid](
        x, xq, xs, m, k, x.stride(0), xq.stride(0), xs.stride(0), xs.stride(1), group, BLOCK_M=block_m,
        BLOCK_G=block_g, POW2=pow2_scales, GATED=gated_input, PDL=pdl,
        num_warps=4 if block_m * block_g >= 1024 else 1, launch_pdl=pdl,
    )  # fmt: skip
    return xq, xs
