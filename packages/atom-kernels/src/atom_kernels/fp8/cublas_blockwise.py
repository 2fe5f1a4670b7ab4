"""Block-scaled W8A8 through cuBLAS: torch's scaled_mm with 1x128 activation and 128x128 weight scales.

On Hopper, cuBLAS (12.9+) applies DeepSeek-V3's two scale grids inside its own warp-specialized fp8 GEMM,
which reaches ~1.6x the bf16 GEMM's rate at prefill's row counts, where the Triton kernel (gemm.py), one
warpgroup whose scaled accumulate sits beside the MMA, stays below bf16 (benchmarks/bench_fp8_linear.py).
It takes exactly the checkpoints' format: 128x128 weight blocks, 128-channel activation groups, N a
multiple of 16 and K of 512 (torch wants the weight's scale rows per column a multiple of 4: other K would
need a padded copy of the scale grid); the activation scales token-major (strides (1, M)) with M a
multiple of 4, which quantize_act writes directly (its padding rows are never read back: output row i
reads only x row i).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from atom_kernels.fp8.act_quant import quantize_act
from atom_kernels.fp8.ref import E4M3

BLOCK = (128, 128)
ROW_ALIGN = 4  # cuBLAS refuses (CUBLAS_STATUS_NOT_SUPPORTED) a token-major scale column of other lengths
K_ALIGN = 4 * BLOCK[1]  # torch checks the weight scale grid's K side against ceil(K / 128) rounded up to 4
_OUT_DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def _device_has_blockwise(index: int) -> bool:
    """torch's scaled_mm knows the blockwise recipes and runs them on this GPU's cuBLAS: Hopper (sm90)
    with CUDA; Blackwell's block-scaled formats differ (ue8m0/swizzled) and ROCm has no such path."""
    if torch.version.cuda is None or not hasattr(F, "ScalingType"):
        return False
    if not hasattr(F.ScalingType, "BlockWise128x128"):
        return False
    return torch.cuda.get_device_capability(index) == (9, 0)


def cublas_blockwise_supported(
    n: int, k: int, block: tuple[int, int], out_dtype: torch.dtype, device: torch.device
) -> bool:
    """Whether cublas_w8a8 runs this layer: a weight [N, K] in `block` tiles, output in out_dtype."""
    if device.type != "cuda" or tuple(block) != BLOCK or out_dtype not in _OUT_DTYPES:
        return False
    if k % K_ALIGN or n % 16:
        return False
    return _device_has_blockwise(device.index if device.index is not None else torch.cuda.current_device())


def blockwise_mm(
    xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """The GEMM alone: xq [M_pad, K] e4m3 and xs [M_pad, K/128] token-major (quantize_act with
    token_major_scales=True, pad_rows_to=ROW_ALIGN), weight [N, K] e4m3, scale [ceil(N/128), K/128] fp32,
    both contiguous -> [M_pad, N] in out_dtype."""
    if weight.dtype != E4M3 or not (weight.is_contiguous() and scale.is_contiguous()):
        raise ValueError(
            "blockwise_mm expects a contiguous e4m3 weight [N, K] and a contiguous fp32 scale grid"
        )
    return F.scaled_mm(
        xq,
        weight.t(),  # [K, N] column-major: the weight's rows as they are stored
        xs,
        F.ScalingType.BlockWise1x128,
        scale.t(),  # [K/128, ceil(N/128)] with strides (1, K/128): the grid as stored
        F.ScalingType.BlockWise128x128,
        output_dtype=out_dtype,
    )


def cublas_w8a8(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    pow2_scales: bool = False,
    gated_input: bool = False,
) -> torch.Tensor:
    """x [M, K] bf16/fp16 -> [M, N] in x's dtype: x quantized per token and 128 channels, times the e4m3
    weight [N, K] with fp32 scale [ceil(N/128), K/128] (contiguous), plus bias [N]; with gated_input x is
    [M, 2K] and silu_and_mul(x) is quantized in the same pass. The caller checks
    cublas_blockwise_supported first (fp8_linear does)."""
    m = x.shape[0]
    xq, xs = quantize_act(
        x,
        BLOCK[1],
        pow2_scales=pow2_scales,
        token_major_scales=True,
        pad_rows_to=ROW_ALIGN,
        gated_input=gated_input,
    )
    y = blockwise_mm(xq, xs, weight, scale, x.dtype)
    y = y[:m] if y.shape[0] != m else y
    if bias is not None:
        y = y + bias
    return y
