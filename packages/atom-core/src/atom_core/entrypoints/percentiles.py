"""Percentiles of a benchmark's samples, one rule for every `atom` benchmark (inclusive: p100 is the max)."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100, interpolated between samples) of values (at least one)."""
    if not 0 < q <= 100:
        raise ValueError(f"a percentile is in (0, 100], got {q:g}")
    if len(values) == 1:
        return values[0]
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: list[float]) -> float:
    return statistics.fmean(values)
