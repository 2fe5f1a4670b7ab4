"""What an expert computes besides its two matmuls: how the gate and up halves combine, and biases.

Most families combine silu(gate) * up with no biases (Llama-style experts: Qwen, DeepSeek, Mixtral).
GPT-OSS clamps both halves and gates with a scaled sigmoid, `(clamp(up, -l, l) + 1) * g * sigmoid(alpha * g)`
with `g = min(gate, l)`, and adds a bias after each of its expert matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "swiglu_oai")


@dataclass(frozen=True, slots=True)
class ExpertActivation:
    """kind: "silu" (silu(gate) * up) or "swiglu_oai" (GPT-OSS's clamped form, with alpha and limit)."""

    kind: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self):
        if self.kind not in ACTIVATIONS:
            raise ValueError(f"expert activation {self.kind!r} is not supported (supported: {ACTIVATIONS})")
        if self.kind == "swiglu_oai" and not self.limit > 0:
            raise ValueError(f"swiglu_oai needs a positive limit, got {self.limit!r}")

    @property
    def code(self) -> int:
        """The kernels' constexpr for this kind (its index in ACTIVATIONS)."""
        return ACTIVATIONS.index(self.kind)

    def ref(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """The reference: gate, up [..., I] -> [..., I] in their dtype."""
        if self.kind == "silu":
            return F.silu(gate) * up
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * gate * torch.sigmoid(gate * self.alpha)


SILU = ExpertActivation()


@dataclass(frozen=True, slots=True)
class ExpertBiases:
    """w13: [E, 2I] added to the gate/up product (gate half, then up half), w2: [E, H] added to the down
    product before its routing weight scales it. Both contiguous, in any float dtype (added in fp32)."""

    w13: torch.Tensor
    w2: torch.Tensor

    def check(self, experts: int, inter: int, hidden: int) -> None:
        for name, bias, want in (("w13", self.w13, (experts, 2 * inter)), ("w2", self.w2, (experts, hidden))):
            if tuple(bias.shape) != want or not bias.is_contiguous() or not bias.is_floating_point():
                raise ValueError(
                    f"the experts' {name} bias must be a contiguous float tensor {want}, got {bias.dtype} "
                    f"{tuple(bias.shape)}"
                )
