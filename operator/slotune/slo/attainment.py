"""SLO attainment: the one definition of whether a latency target holds, with its uncertainty.

A target "pXX of M <= bound" holds exactly when at least XX% of the samples of M are within the
bound. So the quantity to judge is the *attainment*, the fraction of samples within the bound,
against XX%. A run sees only a sample of the engine's behaviour, so the attainment gets a
Wilson score interval (GuideLLM's goodput profile does the same), and a verdict is given only
when the interval lies wholly on one side of XX%; otherwise it is `Unresolved`, never a pass.

Requests close in time share the engine's state (a queue episode delays every request behind
it; one prefill step stalls every stream in flight), so a run's samples are not independent and
a Wilson interval on their raw count would be too narrow. A run's attainment therefore counts
only its *effective* samples: its requests in arrival order fall into consecutive batches, and
the spread of the batch attainments measures the run's own variance (the method of batch
means); the raw count is divided by the design effect that spread shows.

Every user of an SLO reads the metric definitions here: the trial's capacity search, the
tuner's constraint, live on-call judgement from Prometheus's buckets, and the report.

- ttft, tpot, e2e: one sample per request. TPOT is (e2e - ttft) / (output tokens - 1), as
  vLLM's `request_time_per_output_token_seconds` histogram observes it.
- itl: one sample per inter-token gap, as vLLM's `inter_token_latency_seconds` observes it.
- A request that failed or did not finish is one sample outside the bound, for every metric:
  an engine that drops requests does not meet its SLO by dropping them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist
from typing import Literal, Protocol

from slotune.models import SloSpec, SloTarget

CONFIDENCE = 0.95
"""Two-sided confidence of the attainment interval."""


def z_value(confidence: float) -> float:
    """The standard normal quantile of a two-sided interval at `confidence`."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(
    good: float, total: float, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion good/total; (0, 1) for no samples.
    Counts may be effective (fractional) sample counts."""
    if good < 0 or total < 0 or good > total:
        raise ValueError(f"need 0 <= good <= total, got {good} of {total}")
    if total == 0:
        return 0.0, 1.0
    z = z_value(confidence)
    p = good / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    # At 0 or all good the bound is exactly 0 or 1: the subtraction leaves rounding (1e-17).
    low = 0.0 if good == 0 else max(0.0, centre - half)
    high = 1.0 if good == total else min(1.0, centre + half)
    return low, high


def requests_to_resolve(percentile: float, confidence_z: float) -> int:
    """The fewest samples at which a run with every sample within the bound can pass:
    Wilson's lower bound of n/n is n / (n + z^2), at least p when n >= z^2 p / (1 - p). Fewer
    samples than this can fail a target, never meet it."""
    p = percentile / 100
    return math.ceil(confidence_z**2 * p / (1 - p))


class Verdict(StrEnum):
    PASS = "Pass"  # noqa: S105 - a verdict, not a password; the whole interval is at or above the target attainment
    FAIL = "Fail"  # the whole interval is below it
    UNRESOLVED = "Unresolved"  # the interval straddles it: more samples needed


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    """Every target must pass; one failed target fails the whole."""
    if any(v == Verdict.FAIL for v in verdicts):
        return Verdict.FAIL
    if verdicts and all(v == Verdict.PASS for v in verdicts):
        return Verdict.PASS
    return Verdict.UNRESOLVED


BATCHES = 6
"""Consecutive batches of a run's requests whose attainments measure the run's own variance.
Batch means hold only when a batch is long beside the misses' runs: a window of 77 requests in
10 batches of 8 is as short as a burst of slow requests, and neighbouring batches then share
it, so the spread between batches understates the run's (the simulation's coverage fell to
87% on bursts 8 requests long). Six batches of 13 keep 5 degrees of freedom, which
`crossing.TEMPER` allows for."""


def effective_samples(per_request: Sequence[tuple[int, int]], batches: int = BATCHES) -> float:
    """How many independent samples a run's (good, total) per request, in arrival order, are
    worth: the raw count divided by the design effect, never more than the raw count.

    The requests fall into `batches` consecutive batches of nearly equal size; with G_b of N_b
    samples good in batch b and p = G / N overall, the variance of p from the batches is
    B / (B - 1) * sum_b (G_b - p N_b)^2 / N^2, and the design effect is that over the binomial
    variance p (1 - p) / N (at least 1). Where every sample agrees (p is 0 or 1) the spread says
    nothing, and so does a run of fewer than two batches: the raw count stands.
    """
    counted = [(g, n) for g, n in per_request if n > 0]
    good, total = _totals(counted)
    b = min(batches, len(counted))
    if total == 0 or good in (0, total) or b < 2:
        return float(total)
    p = good / total
    edges = [round(i * len(counted) / b) for i in range(b + 1)]
    squares = 0.0
    for lo, hi in itertools.pairwise(edges):
        g, n = _totals(counted[lo:hi])
        squares += (g - p * n) ** 2
    variance = b / (b - 1) * squares / total**2
    design_effect = max(1.0, variance / (p * (1 - p) / total))
    return total / design_effect


@dataclass(frozen=True)
class Attainment:
    """One target judged: `good` of `total` samples within `max_seconds`, with its interval
    over `effective` samples (`total` divided by the design effect of the run's batches)."""

    name: str
    percentile: float
    max_seconds: float
    good: int
    total: int
    low: float
    high: float
    effective: float | None = None

    @property
    def fraction(self) -> float | None:
        return self.good / self.total if self.total else None

    @property
    def needed(self) -> float:
        return self.percentile / 100

    @property
    def verdict(self) -> Verdict:
        if self.total and self.low >= self.needed:
            return Verdict.PASS
        if self.total and self.high < self.needed:
            return Verdict.FAIL
        return Verdict.UNRESOLVED

    def describe(self) -> str:
        goal = f"p{self.percentile:g} {self.name} <= {self.max_seconds:g}s"
        if not self.total:
            return f"{goal}: no samples"
        worth = (
            f", worth {self.effective:.0f} independent"
            if self.effective is not None and self.effective < self.total - 0.5
            else ""
        )
        return (
            f"{goal}: {self.verdict.lower()}, {self.good} of {self.total} within "
            f"({self.good / self.total:.1%}{worth}, interval {self.low:.1%}-{self.high:.1%}, "
            f"{self.percentile:g}% needed)"
        )


def judge(
    name: str,
    target: SloTarget,
    good: int,
    total: int,
    confidence: float = CONFIDENCE,
    *,
    effective: float | None = None,
) -> Attainment:
    """The attainment of `good` of `total`, its interval over `effective` samples if given."""
    n = total if effective is None else min(float(total), effective)
    low, high = wilson_interval(good * n / total if total else 0.0, n, confidence)
    return Attainment(
        name, target.percentile, target.max_seconds, good, total, low, high, effective
    )


# --- the SLO metrics --------------------------------------------------------------------------


class RequestOutcome(Protocol):
    """What the attainment rule needs of one request (the load generator's result has it)."""

    @property
    def ok(self) -> bool: ...

    @property
    def ttft(self) -> float | None: ...

    @property
    def tpot(self) -> float | None: ...

    @property
    def e2e(self) -> float: ...

    @property
    def itls(self) -> list[float]: ...

    @property
    def output_tokens(self) -> int: ...


@dataclass(frozen=True)
class SloMetric:
    """One SLO metric: how a request yields its samples. The histogram that observes the same
    quantity in production is the engine's (`Engine.metrics[name]`), with its default bounds
    (`Engine.default_buckets[name]`)."""

    name: str
    description: str
    unit: Literal["request", "gap"]
    samples: Callable[[RequestOutcome], list[float]]


def _one(value: float | None) -> list[float]:
    return [] if value is None else [value]


SLO_METRICS: Mapping[str, SloMetric] = {
    m.name: m
    for m in (
        SloMetric(
            "ttft",
            "time to first token",
            "request",
            lambda r: _one(r.ttft),
        ),
        SloMetric(
            "tpot",
            "time per output token, (e2e - ttft) / (output tokens - 1)",
            "request",
            lambda r: _one(r.tpot) if r.output_tokens > 1 else [],
        ),
        SloMetric(
            "itl",
            "inter-token latency, every gap between streamed tokens",
            "gap",
            lambda r: list(r.itls),
        ),
        SloMetric(
            "e2e",
            "end-to-end request latency",
            "request",
            lambda r: [r.e2e],
        ),
    )
}


def per_request(
    name: str, results: Sequence[RequestOutcome], max_seconds: float
) -> list[tuple[int, int]]:
    """(good, total) samples of one metric for each request, in the results' order: a failed
    request is one sample outside the bound."""
    metric = SLO_METRICS[name]
    counts = []
    for result in results:
        if not result.ok:
            counts.append((0, 1))
            continue
        values = metric.samples(result)
        counts.append((sum(1 for v in values if v <= max_seconds), len(values)))
    return counts


def _totals(counts: Sequence[tuple[int, int]]) -> tuple[int, int]:
    return sum(g for g, _ in counts), sum(n for _, n in counts)


def tally(name: str, results: Sequence[RequestOutcome], max_seconds: float) -> tuple[int, int]:
    """(good, total) samples of one metric over all the results."""
    return _totals(per_request(name, results, max_seconds))


def judge_requests(
    slo: SloSpec, results: Sequence[RequestOutcome], confidence: float = CONFIDENCE
) -> dict[str, Attainment]:
    """Every target of `slo` judged from per-request results, in arrival order (the batches
    that measure the run's own variance are consecutive requests)."""
    judged = {}
    for name, target in slo.targets().items():
        counts = per_request(name, results, target.max_seconds)
        good, total = _totals(counts)
        judged[name] = judge(
            name, target, good, total, confidence, effective=effective_samples(counts)
        )
    return judged
