"""vLLM's random dataset's rule for spreading request lengths: each is drawn uniformly from the integers in
[mean x (1 - ratio), mean x (1 + ratio)], at least 1. Shared by `atom bench` and `atom bench-serve`; each
draws with its own generator."""

from __future__ import annotations

import math


def length_bounds(mean: int, ratio: float) -> tuple[int, int]:
    """The inclusive (low, high) that lengths around mean are drawn from; ratio in [0, 1)."""
    if not 0 <= ratio < 1:
        raise ValueError(f"a length spread ratio is in [0, 1), got {ratio:g}")
    return max(1, math.floor(mean * (1 - ratio))), max(1, math.ceil(mean * (1 + ratio)))
