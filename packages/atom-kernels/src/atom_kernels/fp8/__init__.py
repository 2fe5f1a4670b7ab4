"""Block-scaled fp8 linear layers (DeepSeek-V3's format): an e4m3 weight [N, K] with one fp32 scale per
[block_n, block_k] tile (scale [ceil(N/bn), ceil(K/bk)], ragged edge tiles), W ~= q * scale[n // bn, k // bk].
fp8_linear quantizes x per token and block_k group (quantize_act) and multiplies e4m3 tiles on the tensor
cores, applying both scales per k-step: an operand-swapped skinny kernel for decode's 1..64 rows (the
weight's rows on the MMA's long side), and beyond, cuBLAS's blockwise-scaled GEMM on Hopper
(cublas_blockwise.py) or the Triton W8A8 GEMM. One row of a small weight instead streams the e4m3 weight
with x left in its dtype (weight-only). The torch reference (the CPU path) dequantizes the weight and
computes in fp32.
"""

from atom_kernels.fp8.act_quant import quantize_act
from atom_kernels.fp8.linear import fp8_linear
from atom_kernels.fp8.ref import (
    E4M3,
    E4M3_MAX,
    dequantize_weight_ref,
    fp8_linear_ref,
    quantize_act_ref,
    quantize_weight_ref,
    scale_grid,
)

__all__ = [
    "E4M3",
    "E4M3_MAX",
    "dequantize_weight_ref",
    "fp8_linear",
    "fp8_linear_ref",
    "quantize_act",
    "quantize_act_ref",
    "quantize_weight_ref",
    "scale_grid",
]
