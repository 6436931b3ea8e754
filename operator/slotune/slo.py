"""Whether latency SLOs hold, decided from plain data.

Two kinds of evidence: per-request samples from the load generator (trials), where the
percentile is exact; and a Prometheus histogram (live traffic), where "pN <= threshold" is only
decidable when the threshold is a bucket bound, or when the neighbouring bounds already settle
it. vLLM's default TTFT buckets jump from 1.0 s to 2.5 s, so "p95 < 2 s" is usually not
decidable; `custom_histogram_buckets` renders the `--custom-histogram-buckets` value that adds
bounds around each SLO threshold so that it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slotune.attainment import wilson_interval
from slotune.models import SloSpec, SloTarget
from slotune.stats import percentile as exact_percentile

# --- per-request samples ------------------------------------------------------------------


@dataclass(frozen=True)
class TargetResult:
    """One SLO target judged from samples."""

    name: str
    percentile: float
    max_seconds: float
    observed_seconds: float | None  # None with no samples
    samples: int
    met: bool | None  # None with no samples

    def describe(self) -> str:
        bound = f"p{self.percentile:g} {self.name} <= {self.max_seconds:g}s"
        if self.observed_seconds is None:
            return f"{bound}: no samples"
        verdict = "met" if self.met else "violated"
        return f"{bound}: {verdict} ({self.observed_seconds:.4g}s over {self.samples} requests)"


@dataclass(frozen=True)
class SloResult:
    """Every target of an SloSpec; `met` is None when some target had no samples and none
    was violated."""

    targets: Mapping[str, TargetResult]
    met: bool | None

    def describe(self) -> str:
        return "; ".join(t.describe() for t in self.targets.values())


def judge_target(name: str, target: SloTarget, values: Sequence[float]) -> TargetResult:
    """A target is met when the exact percentile of the samples is at most the bound."""
    if not values:
        return TargetResult(name, target.percentile, target.max_seconds, None, 0, None)
    observed = exact_percentile(values, target.percentile)
    return TargetResult(
        name,
        target.percentile,
        target.max_seconds,
        observed,
        len(values),
        observed <= target.max_seconds,
    )


def combine(results: Sequence[bool | None]) -> bool | None:
    """All met → True; any violated → False; otherwise undecided."""
    if any(r is False for r in results):
        return False
    if all(r is True for r in results):
        return True
    return None


def evaluate_samples(slo: SloSpec, samples: Mapping[str, Sequence[float]]) -> SloResult:
    """Judge every target of `slo` from per-request values in seconds, keyed like the
    targets (`ttft`, `tpot`, `itl`, `e2e`); a target without values is undecided."""
    targets = {
        name: judge_target(name, target, samples.get(name, ()))
        for name, target in slo.targets().items()
    }
    return SloResult(targets, combine([t.met for t in targets.values()]))


# --- Prometheus histograms ----------------------------------------------------------------

Bucket = tuple[float, float]
"""(upper bound, cumulative count), as `slotune.metrics` returns them."""


def histogram_quantile(percentile: float, buckets: Sequence[Bucket]) -> float:
    """PromQL's `histogram_quantile` on cumulative buckets (linear interpolation inside the
    bucket holding the rank; the first bucket starts at 0; a rank in the +Inf bucket gives
    the largest finite bound). NaN without a +Inf bucket or without observations."""
    q = percentile / 100
    ordered = _coalesce(buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):  # a bound and +Inf at least
        return math.nan
    observations = ordered[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    index = next(
        (i for i, (_, count) in enumerate(ordered[:-1]) if count >= rank), len(ordered) - 1
    )
    if index == len(ordered) - 1:
        return ordered[-2][0]
    upper, count = ordered[index]
    if index == 0 and upper <= 0:
        return upper
    lower = 0.0
    if index > 0:
        lower, below = ordered[index - 1]
        count -= below
        rank -= below
    return lower + (upper - lower) * (rank / count)


def _coalesce(buckets: Sequence[Bucket]) -> list[Bucket]:
    """Sorted by bound, equal bounds merged, counts made monotonic (as Prometheus does for
    counters scraped at slightly different moments)."""
    merged: dict[float, float] = {}
    for bound, count in buckets:
        merged[bound] = merged.get(bound, 0.0) + count
    result: list[Bucket] = []
    highest = 0.0
    for bound, count in sorted(merged.items()):
        highest = max(highest, count)
        result.append((bound, highest))
    return result


@dataclass(frozen=True)
class HistogramVerdict:
    """Whether pN <= threshold, judged from a histogram.

    `met` is None when the histogram cannot decide (`resolvable` False) or holds no
    observations; `estimate` is histogram_quantile's interpolated value, for display only.
    """

    met: bool | None
    resolvable: bool
    reason: str
    estimate: float | None
    observations: float


def _fraction_text(count: float, total: float) -> str:
    return f"{count:g} of {total:g} ({count / total:.2%})"


def judge_histogram(
    buckets: Sequence[Bucket],
    percentile: float,
    max_seconds: float,
    *,
    confidence: float | None = None,
) -> HistogramVerdict:
    """Decide "p{percentile} <= max_seconds" from cumulative buckets.

    pN <= t exactly when the fraction of observations <= t (the attainment) is at least N/100.
    When t is a bucket bound that fraction is known. Otherwise it lies between the fractions at
    the neighbouring bounds: at least N/100 already at the bound below → met; below N/100 even
    at the bound above → violated; anything else cannot be decided from this histogram.

    Without `confidence` this describes the observations themselves. With it (live on-call
    judgement: the window is a sample of the engine's behaviour) each fraction is taken as a
    Wilson interval (`slotune.attainment`), as a trial judges its requests: met only when the
    interval lies wholly at or above N/100, violated only when wholly below, and otherwise
    undecided until more traffic has been seen.
    """
    if not 0 < percentile < 100:
        raise ValueError(f"percentile must be within 0..100 (exclusive), got {percentile}")
    ordered = _coalesce(buckets)
    if not ordered or not math.isinf(ordered[-1][0]):
        return HistogramVerdict(None, False, "the histogram has no +Inf bucket", None, 0.0)
    total = ordered[-1][1]
    if total == 0:
        return HistogramVerdict(None, True, "no observations in the window", None, 0.0)
    estimate = histogram_quantile(percentile, ordered)
    shown = None if math.isnan(estimate) else estimate
    need = percentile / 100
    goal = f"p{percentile:g} <= {max_seconds:g}s"

    def interval(count: float) -> tuple[float, float]:
        if confidence is None:
            return count / total, count / total
        return wilson_interval(round(count), round(total), confidence)

    def shown_interval(count: float) -> str:
        if confidence is None:
            return ""
        lower, upper = interval(count)
        return f", interval {lower:.2%}-{upper:.2%}"

    exact = next((c for b, c in ordered if math.isclose(b, max_seconds, rel_tol=1e-9)), None)
    if exact is not None:
        lower, upper = interval(exact)
        met = True if lower >= need else False if upper < need else None
        verdict = {True: "met", False: "violated", None: "undecided"}[met]
        reason = (
            f"{goal} {verdict}: {_fraction_text(exact, total)} observations are "
            f"<= {max_seconds:g}s{shown_interval(exact)}, {percentile:g}% needed"
        )
        if met is None:
            reason += "; more traffic will decide it"
        return HistogramVerdict(met, True, reason, shown, total)

    below = [(b, c) for b, c in ordered if b < max_seconds]
    above = next((b, c) for b, c in ordered if b > max_seconds)  # +Inf is always above
    if below and interval(below[-1][1])[0] >= need:
        bound, count = below[-1]
        reason = (
            f"{goal} met: already {_fraction_text(count, total)} observations are "
            f"<= {bound:g}s, below the threshold{shown_interval(count)}"
        )
        return HistogramVerdict(True, True, reason, shown, total)
    if interval(above[1])[1] < need:
        bound, count = above
        reason = (
            f"{goal} violated: only {_fraction_text(count, total)} observations are "
            f"<= {bound:g}s, above the threshold{shown_interval(count)}"
        )
        return HistogramVerdict(False, True, reason, shown, total)
    low = f"{below[-1][0]:g}s" if below else "0s"
    settled_by_points = bool(below and below[-1][1] >= need * total) or above[1] < need * total
    if settled_by_points:
        reason = (
            f"{goal} undecided: the bucket bounds {low} and {above[0]:g}s would settle it, but "
            "not yet with confidence; more traffic will decide it"
        )
        return HistogramVerdict(None, True, reason, shown, total)
    reason = (
        f"{goal} undecidable: p{percentile:g} lies between the bucket bounds {low} and "
        f"{above[0]:g}s, and {max_seconds:g}s is not a bound; add it with "
        f"--custom-histogram-buckets"
    )
    return HistogramVerdict(None, False, reason, shown, total)


# --- vLLM's --custom-histogram-buckets ------------------------------------------------------

# vLLM's default bounds (vllm/v1/metrics/buckets.py, 0.32 and 0.33).
DEFAULT_BUCKETS: Mapping[str, tuple[float, ...]] = {
    "time_to_first_token": (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ),
    "inter_token_latency": (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0,
    ),
    "request_latency": (
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
    ),
}  # fmt: skip

# The histogram family each SLO target is measured by; TPOT and ITL share one.
TARGET_FAMILY: Mapping[str, str] = {
    "ttft": "time_to_first_token",
    "tpot": "inter_token_latency",
    "itl": "inter_token_latency",
    "e2e": "request_latency",
}

THRESHOLD_FACTORS: tuple[float, ...] = (0.8, 0.9, 1.0, 1.1, 1.25)


def _round_bound(value: float) -> float:
    """Six significant digits, so 0.1 x 1.1 is 0.11 and not 0.11000000000000001."""
    return float(f"{value:.6g}")


def histogram_bounds(
    slo: SloSpec, factors: Sequence[float] = THRESHOLD_FACTORS
) -> dict[str, list[float]]:
    """Per family touched by a target: vLLM's default bounds plus threshold x each factor.
    Families without a target are left out, so vLLM keeps its defaults for them."""
    if any(f <= 0 for f in factors):
        raise ValueError(f"factors must be positive, got {list(factors)}")
    bounds: dict[str, set[float]] = {}
    for name, target in slo.targets().items():
        family = TARGET_FAMILY[name]
        chosen = bounds.setdefault(family, set(DEFAULT_BUCKETS[family]))
        chosen.add(target.max_seconds)  # the threshold itself, exactly as written
        chosen.update(_round_bound(target.max_seconds * f) for f in factors)
    result: dict[str, list[float]] = {}
    for family, values in sorted(bounds.items()):
        ordered: list[float] = []
        for value in sorted(values):
            # vLLM wants strictly increasing bounds; drop near-duplicates of float arithmetic.
            if not ordered or not math.isclose(value, ordered[-1], rel_tol=1e-9):
                ordered.append(value)
        result[family] = ordered
    return result


def custom_histogram_buckets(slo: SloSpec, factors: Sequence[float] = THRESHOLD_FACTORS) -> str:
    """The value of vLLM's `--custom-histogram-buckets` for this SLO: a JSON object from
    bucket family to strictly increasing positive bounds, which replace that family's
    defaults (`ObservabilityConfig.custom_histogram_buckets`)."""
    return json.dumps(histogram_bounds(slo, factors), separators=(",", ":"), sort_keys=True)
