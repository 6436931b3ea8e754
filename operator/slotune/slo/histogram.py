"""Whether latency SLOs hold, decided from plain data.

Two kinds of evidence: per-request samples from the load generator (trials), where the
percentile is exact; and a Prometheus histogram (live traffic), where "pN <= threshold" is only
decidable when the threshold is a bucket bound, or when the neighbouring bounds already settle
it. vLLM's default TTFT buckets jump from 1.0 s to 2.5 s, so "p95 < 2 s" is usually not
decidable; each engine adapter renders the flags that add bounds around each SLO threshold so
that it is (`Engine.observability_args`, from `slotune.engine.base.bounds_around`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slotune.models import SloSpec, SloTarget
from slotune.slo.attainment import wilson_interval
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
    Wilson interval (`slotune.slo.attainment`), as a trial judges its requests: met only when the
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
