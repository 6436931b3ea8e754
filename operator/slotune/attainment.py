"""SLO attainment: the one definition of whether a latency target holds, with its uncertainty.

A target "pXX of M <= bound" holds exactly when at least XX% of the samples of M are within the
bound. So the quantity to judge is the *attainment*, the fraction of samples within the bound,
against XX%. A run sees only a sample of the engine's behaviour, so the attainment gets a
Wilson score interval (GuideLLM's goodput profile does the same), and a verdict is given only
when the interval lies wholly on one side of XX%; otherwise it is `Unresolved`, never a pass.

Every user of an SLO reads the metric definitions here: the trial's capacity search, the
tuner's constraint, live on-call judgement from Prometheus's buckets, and the report.

- ttft, tpot, e2e: one sample per request. TPOT is (e2e - ttft) / (output tokens - 1), as
  vLLM's `request_time_per_output_token_seconds` histogram observes it.
- itl: one sample per inter-token gap, as vLLM's `inter_token_latency_seconds` observes it.
- A request that failed or did not finish is one sample outside the bound, for every metric:
  an engine that drops requests does not meet its SLO by dropping them.
"""

from __future__ import annotations

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


def wilson_interval(good: int, total: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion good/total; (0, 1) for no samples."""
    if good < 0 or total < 0 or good > total:
        raise ValueError(f"need 0 <= good <= total, got {good} of {total}")
    if total == 0:
        return 0.0, 1.0
    z = z_value(confidence)
    p = good / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


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


@dataclass(frozen=True)
class Attainment:
    """One target judged: `good` of `total` samples within `max_seconds`."""

    name: str
    percentile: float
    max_seconds: float
    good: int
    total: int
    low: float
    high: float

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
        return (
            f"{goal}: {self.verdict.lower()}, {self.good} of {self.total} within "
            f"({self.good / self.total:.1%}, interval {self.low:.1%}-{self.high:.1%}, "
            f"{self.percentile:g}% needed)"
        )


def judge(
    name: str, target: SloTarget, good: int, total: int, confidence: float = CONFIDENCE
) -> Attainment:
    low, high = wilson_interval(good, total, confidence)
    return Attainment(name, target.percentile, target.max_seconds, good, total, low, high)


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
    """One SLO metric: how a request yields its samples, and the vLLM histogram (and its
    bucket family) that observes the same quantity in production."""

    name: str
    description: str
    unit: Literal["request", "gap"]
    histogram: str
    bucket_family: str
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
            "vllm:time_to_first_token_seconds",
            "time_to_first_token",
            lambda r: _one(r.ttft),
        ),
        SloMetric(
            "tpot",
            "time per output token, (e2e - ttft) / (output tokens - 1)",
            "request",
            "vllm:request_time_per_output_token_seconds",
            "inter_token_latency",
            lambda r: _one(r.tpot) if r.output_tokens > 1 else [],
        ),
        SloMetric(
            "itl",
            "inter-token latency, every gap between streamed tokens",
            "gap",
            "vllm:inter_token_latency_seconds",
            "inter_token_latency",
            lambda r: list(r.itls),
        ),
        SloMetric(
            "e2e",
            "end-to-end request latency",
            "request",
            "vllm:e2e_request_latency_seconds",
            "request_latency",
            lambda r: [r.e2e],
        ),
    )
}


def tally(name: str, results: Sequence[RequestOutcome], max_seconds: float) -> tuple[int, int]:
    """(good, total) samples of one metric: a failed request is one sample outside the bound."""
    metric = SLO_METRICS[name]
    good = total = 0
    for result in results:
        if not result.ok:
            total += 1
            continue
        values = metric.samples(result)
        total += len(values)
        good += sum(1 for v in values if v <= max_seconds)
    return good, total


def judge_requests(
    slo: SloSpec, results: Sequence[RequestOutcome], confidence: float = CONFIDENCE
) -> dict[str, Attainment]:
    """Every target of `slo` judged from per-request results."""
    return {
        name: judge(name, target, *tally(name, results, target.max_seconds), confidence)
        for name, target in slo.targets().items()
    }
