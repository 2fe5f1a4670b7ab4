"""Argument pack of the fp8 GEMM kernels (gemm.py, skinny_w8a8.py, stream.py): block-scaled e4m3 rows.

Triton passes a tuple argument as its fields, each specialized as a plain argument would be (see
attention/packs.py), so a kernel takes its quantized operands as one pack each instead of four parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ScaledRows(NamedTuple):
    """e4m3 rows [R, K] (last dim contiguous) and their fp32 scales, one per group of block_k columns:
    activations [R, ceil(K/bk)] (a scale per row and group), weights [ceil(N/bn), ceil(K/bk)] (one per
    bn x bk block); each with its row stride, and the rows a scale row covers (bn; 1 for activations)."""

    q: torch.Tensor
    scale: torch.Tensor
    stride: int
    stride_scale: int
    block_rows: int


def scaled_rows(q: torch.Tensor, scale: torch.Tensor, block_rows: int = 1) -> ScaledRows:
    return ScaledRows(q, scale, q.stride(0), scale.stride(0), block_rows)
