"""Pure-torch references for block-scaled fp8 (e4m3): weight blocks, per-token activation groups, the GEMM.

The format is DeepSeek-V3's: a weight [N, K] is stored as e4m3 values and one fp32 multiplier per
[block_n, block_k] tile (`scale` [ceil(N / block_n), ceil(K / block_k)]; edge tiles are ragged), so
W ~= q * scale[n // block_n, k // block_k]. Activations are quantized per token and per group of
block_k channels at run time ("dynamic"): x ~= xq * xs[m, k // block_k].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
ACT_EPS = 1e-4  # floor of a group's absmax: an all-zero group gets a finite scale


def _div448(t: torch.Tensor) -> torch.Tensor:
    """t / 448 rounded as IEEE division (on CUDA, torch multiplies by the reciprocal of a Python scalar,
    which can land one ulp away from the kernels' division)."""
    return t / torch.full_like(t, E4M3_MAX)


def scale_grid(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    """The scale tensor's shape for a [N, K] weight in [block_n, block_k] tiles."""
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


def expand_scale(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """scale [ceil(N/bn), ceil(K/bk)] -> [N, K]: each element's multiplier."""
    full = scale.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return full[: shape[0], : shape[1]]


def quantize_weight_ref(
    w: torch.Tensor, block: tuple[int, int], scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [N, K] -> (q [N, K] e4m3, scale [ceil(N/bn), ceil(K/bk)]): each tile's absmax maps to 448 (a
    zero tile gets scale 1); ragged edge tiles take the absmax of the elements they have."""
    n, k = w.shape
    rows, cols = scale_grid((n, k), block)
    padded = F.pad(w.float(), (0, cols * block[1] - k, 0, rows * block[0] - n))
    tiles = padded.view(rows, block[0], cols, block[1])
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, _div448(amax), torch.ones_like(amax)).to(scale_dtype)
    q = (tiles / scale.float()[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.view(rows * block[0], cols * block[1])[:n, :k].contiguous(), scale


def dequantize_weight_ref(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """q: [N, K] e4m3, scale: [ceil(N/bn), ceil(K/bk)] -> W [N, K] in dtype (products in fp32)."""
    return (q.float() * expand_scale(scale, block, tuple(q.shape))).to(dtype)


def quantize_act_ref(
    x: torch.Tensor, group: int, *, pow2_scales: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (xq [M, K] e4m3, xs [M, ceil(K/group)] fp32), per token and per `group` channels:
    xs = max(absmax, 1e-4) / 448 (rounded up to a power of two with pow2_scales, DeepSeek-V3.1's
    "ue8m0" scales), xq = x / xs."""
    m, k = x.shape
    groups = math.ceil(k / group)
    xg = F.pad(x.float(), (0, groups * group - k)).view(m, groups, group)
    xs = _div448(xg.abs().amax(dim=-1).clamp_min(ACT_EPS))
    if pow2_scales:
        xs = torch.exp2(torch.ceil(torch.log2(xs)))
    xq = (xg / xs[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return xq.view(m, groups * group)[:, :k].contiguous(), xs


def fp8_linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
    *,
    quantize_input: bool = False,
    pow2_scales: bool = False,
) -> torch.Tensor:
    """x: [M, K]; weight: [N, K] e4m3; scale: [ceil(N/bn), ceil(K/bk)] -> [M, N] in x's dtype, fp32 math.

    Without quantize_input the weight is dequantized and x used as it is (the weight-only product the
    CPU path computes); with it x is quantized per token and block_k group first (the W8A8 product)."""
    w = dequantize_weight_ref(weight, scale, block)
    xf = x.float()
    if quantize_input:
        xq, xs = quantize_act_ref(x, block[1], pow2_scales=pow2_scales)
        xf = xq.float() * xs.repeat_interleave(block[1], 1)[:, : x.shape[1]]
    y = xf @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
