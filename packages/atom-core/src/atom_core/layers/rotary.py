"""Rotary position embeddings (neox style: rotate halves), with default, linear, dynamic, llama3 and yarn scaling."""

from __future__ import annotations

import math

import torch
from torch import nn

from atom_core.config import RopeConfig
from atom_core.ops import apply_mrope, apply_rotary


def rope_frequencies(rope: RopeConfig, rotary_dim: int, max_position: int, seq_len: int | None = None):
    """(inv_freq [rotary_dim / 2] fp32, attention scaling). seq_len matters only for dynamic scaling."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    base = rope.theta
    # Dynamic NTK grows the base past max_position_embeddings (transformers ignores original_max_position here)
    if rope.rope_type == "dynamic" and seq_len is not None and seq_len > max_position:
        base = base * ((rope.factor * seq_len / max_position) - (rope.factor - 1)) ** (
            rotary_dim / (rotary_dim - 2)
        )
    inv_freq = 1.0 / base**exponents
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3(inv_freq, rope, max_position), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, rotary_dim, max_position)
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig, max_position: int) -> torch.Tensor:
    original = rope.original_max_position or max_position
    low_wavelen = original / rope.low_freq_factor
    high_wavelen = original / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)  # long waves: interpolate
    smooth = (original / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context grown `factor` times (1 when it is not grown)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(rope: RopeConfig, dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    original = rope.original_max_position or max_position
    scaling = rope.attention_factor
    if scaling is None and rope.mscale and rope.mscale_all_dim:
        scaling = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
    elif scaling is None:
        scaling = yarn_mscale(rope.factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    extrapolate = 1 - ramp  # high frequencies keep their original rate
    inv_freq = (1.0 / (rope.factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv_freq, float(scaling)


class RotaryEmbedding(nn.Module):
    """neox: rotate halves (Llama, Qwen); False: adjacent pairs (DeepSeek's interleaved rope dims)."""

    def __init__(self, head_dim: int, rope: RopeConfig, max_position: int, *, neox: bool = True):
        super().__init__()
        self.rope, self.neox = rope, neox
        self.head_dim = head_dim
        self.rotary_dim = int(head_dim * rope.partial_rotary_factor)
        self.max_position = max_position
        inv_freq, self.scaling = rope_frequencies(rope, self.rotary_dim, max_position)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions: [T], or [3, T] (rows T, H, W) for a model with mrope_section; q: [T, Hq, D],
        k: [T, Hkv, D] -> both rotated in place (first rotary_dim dims)."""
        if positions.dim() == 2:
            if self.rope.mrope_section is None:
                raise ValueError(
                    f"positions of shape {tuple(positions.shape)} need a model with rope mrope_section; "
                    "this one takes [T] positions"
                )
            return apply_mrope(
                positions,
                q,
                k,
                self.inv_freq,
                rotary_dim=self.rotary_dim,
                section=self.rope.mrope_section,
                interleaved=self.rope.mrope_interleaved,
                scaling=self.scaling,
                neox=self.neox,
            )
        inv_freq = self.inv_freq
        if self.rope.rope_type == "dynamic":  # the base grows with the longest sequence in the batch
            seq_len = int(positions.max()) + 1 if positions.numel() else 0  # a host sync: no CUDA graphs
            inv_freq, _ = rope_frequencies(self.rope, self.rotary_dim, self.max_position, seq_len)
            inv_freq = inv_freq.to(positions.device)
        return apply_rotary(
            positions, q, k, inv_freq, rotary_dim=self.rotary_dim, scaling=self.scaling, neox=self.neox
        )
