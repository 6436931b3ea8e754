"""Small statistics shared by the load generator, SLO evaluation and the tuner."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) with linear interpolation between order statistics,
    the same definition as numpy's default and `vllm bench serve`. NaN for no values."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
