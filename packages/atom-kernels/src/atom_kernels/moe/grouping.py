"""DeepSeek's grouped routing, described once: what grouped_topk and its torch reference both read."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCORINGS = ("sigmoid", "softmax")


@dataclass(frozen=True, slots=True)
class GroupedRouting:
    """Experts in num_groups equal groups; the topk_groups best groups are kept and the token's experts
    chosen among them. scoring: "sigmoid" (DeepSeek-V3) or "softmax" (DeepSeek-V2); renormalize: the
    chosen weights sum to 1; scaling: multiplies them (routed_scaling_factor)."""

    num_groups: int
    topk_groups: int
    scoring: str = "sigmoid"
    renormalize: bool = True
    scaling: float = 1.0

    def check(self, experts: int, top_k: int, bias: torch.Tensor | None) -> None:
        """ValueError naming what does not fit: E experts, top_k chosen, bias [E] or None."""
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring must be 'sigmoid' or 'softmax', got {self.scoring!r}")
        groups, kept = self.num_groups, self.topk_groups
        if groups < 1 or experts % groups or not 1 <= kept <= groups:
            raise ValueError(f"{experts} experts cannot be split into {groups} groups keeping {kept}")
        group_size = experts // groups
        if top_k > kept * group_size:
            raise ValueError(f"top_k={top_k} exceeds the {kept * group_size} experts of the kept groups")
        if bias is not None and group_size < 2:
            raise ValueError("with a bias a group's score is its two best experts: groups need 2+ experts")
        if bias is not None and bias.shape != (experts,):
            raise ValueError(f"bias must be [{experts}], got {tuple(bias.shape)}")
