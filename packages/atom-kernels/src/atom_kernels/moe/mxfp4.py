"""MXFP4 expert weights (OCP Microscaling, as GPT-OSS checkpoints ship them): e2m1 values, two to a byte
(low nibble first along K), and one e8m0 power-of-two scale per 32 consecutive values along K.

Layout here: weights uint8 [E, N, K / 2] and scales uint8 [E, N, K / 32]; a checkpoint's `*_blocks`
[E, N, K / 32, 16] are the same bytes. The expert GEMMs dequantize each weight tile in registers
(expert_gemm.py) and multiply in the activations' dtype: Hopper has no FP4 MMA. Every e2m1 value times a
power of two is exact in bf16, so weight-only MXFP4 computes with exactly the checkpoint's weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32  # values per scale along K
# e2m1 magnitudes by their three low bits (the fourth is the sign)
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_MAX_EXPONENT = 2  # 6 = 1.5 * 2**2: OCP MX's emax for e2m1
E8M0_BIAS = 127
# The largest scale byte the kernels take: 2**113 (mxfp4_gemv.py builds 2**(byte - 113) from fp32's
# exponent bits). Real checkpoints hold about 2**-20 .. 2**0; 255 is e8m0's NaN.
E8M0_MAX_BYTE = 240


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks uint8 [..., K / 2], scales uint8 [..., K / 32] -> [..., K] in dtype (exact: power-of-two
    scales of e2m1 values)."""
    codes = torch.stack([blocks & 0xF, blocks >> 4], dim=-1).flatten(-2).int()  # [..., K], low nibble first
    # The magnitudes from the code's bits (no table copied from the host: this runs inside CUDA-graph
    # capture on the torch backend): exponent e = bits 1-2, mantissa m = bit 0; e = 0 is subnormal (m / 2).
    e, m = ((codes >> 1) & 3).float(), (codes & 1).float()
    magnitude = torch.where(e == 0, 0.5 * m, torch.exp2(e - 1) * (1 + 0.5 * m))
    values = torch.where(codes >= 8, -magnitude, magnitude)  # codes 8..15 are the negatives
    exponent = scales.to(torch.int32) - E8M0_BIAS
    grouped = values.unflatten(-1, (-1, GROUP)) * torch.exp2(exponent.float())[..., None]
    return grouped.flatten(-2).to(dtype)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., K] (K a multiple of 32) -> (blocks uint8 [..., K / 2], scales uint8 [..., K / 32]), as OCP MX
    rounds: each group's scale is 2**(floor(log2(amax)) - 2), values round to the nearest e2m1 (ties to
    the even code) and saturate at 6. An all-zero group gets the smallest scale."""
    if w.shape[-1] % GROUP:
        raise ValueError(f"MXFP4 quantizes groups of {GROUP} along the last dim, got {w.shape[-1]}")
    groups = w.float().unflatten(-1, (-1, GROUP))
    amax = groups.abs().amax(-1)
    exponent = torch.where(
        amax > 0, torch.floor(torch.log2(amax)) - E2M1_MAX_EXPONENT, torch.full_like(amax, -E8M0_BIAS)
    ).clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = groups / torch.exp2(exponent)[..., None]
    magnitude = scaled.abs().clamp(max=E2M1_MAGNITUDES[-1]).contiguous()
    midpoints = torch.tensor(_MIDPOINTS, device=w.device)
    index = torch.bucketize(magnitude, midpoints)  # a value on a midpoint goes to the lower neighbour...
    on_odd_midpoint = (index % 2 == 1) & (magnitude == midpoints[index.clamp(max=len(_MIDPOINTS) - 1)])
    index = index + on_odd_midpoint.long()  # ...unless that one's code is odd: ties go to the even code
    codes = (index + 8 * (scaled < 0).long()).flatten(-2).to(torch.uint8)
    codes = torch.where(index.flatten(-2) == 0, torch.zeros_like(codes), codes)  # -0 is stored as 0
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + E8M0_BIAS).to(torch.uint8)


@dataclass(frozen=True, slots=True)
class ExpertMxfp4:
    """Scales of MXFP4 expert weights (uint8 w13 [E, 2I, H / 2] and w2 [E, H, I / 2]): w13 [E, 2I, H / 32]
    and w2 [E, H, I / 32], uint8 e8m0, contiguous."""

    w13: torch.Tensor
    w2: torch.Tensor

    def check(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        for name, w, s in (("w13", w13, self.w13), ("w2", w2, self.w2)):
            if w.dtype != torch.uint8:
                raise ValueError(f"MXFP4 {name} must be uint8 (two e2m1 values a byte), got {w.dtype}")
            want = (*w.shape[:-1], 2 * w.shape[-1] // GROUP)
            if (2 * w.shape[-1]) % GROUP or s.dtype != torch.uint8 or tuple(s.shape) != want:
                raise ValueError(
                    f"MXFP4 {name} scales must be uint8 {want} for weights {tuple(w.shape)} (one scale per "
                    f"{GROUP} values), got {s.dtype} {tuple(s.shape)}"
                )
            if not s.is_contiguous():
                raise ValueError(f"MXFP4 {name} scales must be contiguous")

    def dequantize(self, w13: torch.Tensor, w2: torch.Tensor, dtype: torch.dtype):
        """The experts' weights in dtype: w13 [E, 2I, H], w2 [E, H, I]."""
        return dequantize_mxfp4(w13, self.w13, dtype), dequantize_mxfp4(w2, self.w2, dtype)
