"""A MoE block's shared expert, folded into the combine of its routed experts.

Qwen2-MoE, Qwen3-Next and Qwen3.5 add a dense expert's output to every token, scaled by a per-token sigmoid
gate; DeepSeek adds it as is. Done after the MoE, that is a sigmoid, a product and a sum, three launches
a layer at decode's one token; the combine already reads every token's rows, so it adds the term there
and rounds once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SharedExpert:
    """out: [T, H] the shared expert's output (last dim contiguous); gate: [T, 1] or [T] logits whose
    sigmoid scales each token's row (None: added as is)."""

    out: torch.Tensor
    gate: torch.Tensor | None = None

    def check(self, tokens: int, hidden: int) -> None:
        if tuple(self.out.shape) != (tokens, hidden) or self.out.stride(-1) != 1:
            raise ValueError(
                f"the shared expert's output must be [T, H] = [{tokens}, {hidden}] with a contiguous last "
                f"dim, got {tuple(self.out.shape)}"
            )
        if self.gate is not None and self.gate.reshape(-1).shape != (tokens,):
            raise ValueError(
                f"the shared expert's gate must be [T] or [T, 1] = [{tokens}], got {tuple(self.gate.shape)}"
            )

    def term(self) -> torch.Tensor:
        """The reference: [T, H] fp32, the output scaled by its gate's sigmoid."""
        out = self.out.float()
        if self.gate is None:
            return out
        return torch.sigmoid(self.gate.reshape(-1, 1).float()) * out
