"""Capacity: the highest request rate, in the workload's shape, at which every SLO target holds.

This is what a trial measures (DistServe's goodput, GuideLLM's `goodput` profile, AIPerf's
boundary search): a number that ranks configurations that all keep up with the target rate,
and says how much headroom a configuration has. It is found within one engine start by probes
at one rate each: bracket, then bisect.

Everything here is pure; `slotune.tuner.measure` drives the probes against an engine.

- **The rate grid.** Probes run only at rates `target x STEP**k` for integer k, with the
  target the workload's rate times (1 + headroom). So every configuration probed at a rate
  sees the same arrivals (common random numbers: the schedule is seeded by the study seed and
  k), the first probe decides feasibility at once, and a bracket is a whole number of steps.
- **The search.** From k = 0 it moves `jump` steps up after a pass and down after anything
  else until the boundary is bracketed, then bisects to one step. A configuration that fails
  the target is clearly infeasible: it gets a coarse bracket, enough to rank it, and no more.
- **The interval.** A capacity is stated as an interval: the bracket the probes found,
  widened by the measured run-to-run spread of engine starts (`RESTART_SPREAD`). Comparisons
  between configurations (ties, "above the defaults") use the interval.
- **A probe's verdict.** Attainment of every target with a Wilson interval over its effective
  samples (`attainment`: consecutive requests are correlated, batch means measure by how much). A
  probe that is unresolved gets more requests, up to a cap, and stays `Unresolved` after
  that; a probe whose queue or KV usage still climbs at its end is extended the same way and
  stays `Unstable`. Neither counts as a pass: the capacity is the highest rate that passed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from slotune.attainment import (
    CONFIDENCE,
    SLO_METRICS,
    Attainment,
    RequestOutcome,
    Verdict,
    combine,
    tally,
    wilson_interval,
)
from slotune.models import SloSpec

STEP = 2 ** (1 / 6)
"""Rate grid ratio: six steps to a doubling, so one step is 12%."""
MAX_PROBES = 8
RESTART_SPREAD = 2
"""Grid steps by which one configuration's capacity moves between engine starts and arrival
schedules, measured: five fresh engines of vLLM's CPU defaults on five schedules found
capacities over five grid steps, 2.53-4.01 req/s (`bench/results/capacity-repeatability.md`).
A capacity's interval is its bracket widened by this much on each side, so that it states
what another start would find, not only this one; with it, every two of the five overlap."""


MIN_EFFECTIVE = 7.0
"""The fewest effective samples a window of at least MIN_EARLY_WINDOW requests can count,
however its good and bad samples are ordered: batch means over B equal batches give a design
effect of at most N / (B - 1), so B - 1 = 9 effective samples; batches that differ by a request
give a little less (at least 7.6 for every window of 20-400 requests with its bad samples first,
the most clustered order, computed with `attainment.effective_samples`)."""
MIN_EARLY_WINDOW = 20


class ProbeVerdict(StrEnum):
    PASS = "Pass"  # noqa: S105 - a verdict, not a password
    FAIL = "Fail"
    UNRESOLVED = "Unresolved"  # the attainment interval straddled the target at the cap
    UNSTABLE = "Unstable"  # the queue or the KV cache still grew at the end of the probe


@dataclass(frozen=True)
class SearchSettings:
    """How a capacity search spends its probes."""

    target_rate: float
    step: float = STEP
    jump: int = 4  # grid steps per move while bracketing (x1.59)
    max_probes: int = MAX_PROBES
    min_rate: float | None = None  # below this the search stops: "capacity below min_rate"
    max_rate: float | None = None  # above this no probe is sent (e.g. the prefill ceiling)
    precision: int = 1  # grid steps between the last pass and the first non-pass to stop
    infeasible_precision: int = 4  # the same, once the target rate has not passed

    def __post_init__(self) -> None:
        if not self.target_rate > 0:
            raise ValueError(f"target_rate must be > 0, got {self.target_rate}")
        if not self.step > 1:
            raise ValueError(f"step must be > 1, got {self.step}")
        if self.jump < 1 or self.precision < 1 or self.infeasible_precision < 1:
            raise ValueError("jump and the precisions are whole grid steps, at least 1")
        if self.max_probes < 1:
            raise ValueError(f"max_probes must be >= 1, got {self.max_probes}")

    def rate(self, k: int) -> float:
        return self.target_rate * self.step**k

    def index_below(self, rate: float) -> int:
        """The highest grid index whose rate is at most `rate`."""
        return math.floor(math.log(rate / self.target_rate) / math.log(self.step) + 1e-9)

    @property
    def lowest(self) -> int | None:
        if self.min_rate is None:
            return None
        return math.ceil(math.log(self.min_rate / self.target_rate) / math.log(self.step) - 1e-9)

    @property
    def highest(self) -> int | None:
        return None if self.max_rate is None else self.index_below(self.max_rate)


@dataclass(frozen=True)
class Bracket:
    """Where the boundary lies: the highest grid index that passed below the lowest that did
    not (None where there is none)."""

    passed: int | None
    blocked: int | None


def bracket(outcomes: Mapping[int, ProbeVerdict]) -> Bracket:
    """The lowest index that did not pass bounds the capacity from above; the highest pass
    below it bounds it from below. A pass above a non-pass (noise near the boundary) is kept in
    the record but cannot raise the capacity: only a rate with no failure below it counts."""
    blocked = min((k for k, v in outcomes.items() if v != ProbeVerdict.PASS), default=None)
    passed = max(
        (
            k
            for k, v in outcomes.items()
            if v == ProbeVerdict.PASS and (blocked is None or k < blocked)
        ),
        default=None,
    )
    return Bracket(passed, blocked)


def next_probe(settings: SearchSettings, outcomes: Mapping[int, ProbeVerdict]) -> int | None:
    """The grid index to probe next, or None when the search is over."""
    if not outcomes:
        return 0
    if len(outcomes) >= settings.max_probes:
        return None
    b = bracket(outcomes)
    if b.blocked is None:  # everything passed so far: go up
        top = max(outcomes)
        if settings.highest is not None and top >= settings.highest:
            return None
        up = top + settings.jump
        return up if settings.highest is None else min(up, settings.highest)
    if b.passed is None:  # nothing passed: go down
        down = b.blocked - settings.jump
        if settings.lowest is not None and b.blocked <= settings.lowest:
            return None
        return down if settings.lowest is None else max(down, settings.lowest)
    feasible = outcomes.get(0) == ProbeVerdict.PASS
    precision = settings.precision if feasible else settings.infeasible_precision
    if b.blocked - b.passed <= precision:
        return None
    middle = (b.passed + b.blocked) // 2
    return middle if middle not in outcomes else None


def stop_reason(settings: SearchSettings, outcomes: Mapping[int, ProbeVerdict]) -> str:
    """Why a finished search stopped, in words."""
    b = bracket(outcomes)
    if b.blocked is None:
        return "passed at the highest rate probed" + (
            " (the ceiling's rate)" if settings.highest is not None else ""
        )
    if b.passed is None:
        return "did not pass at the lowest rate probed"
    if len(outcomes) >= settings.max_probes and b.blocked - b.passed > settings.precision:
        return f"probe budget ({settings.max_probes}) spent before the bracket closed"
    return "bracketed"


# --- one probe --------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueSample:
    """The engine's own state at one moment of a probe (from its /metrics)."""

    at: float  # seconds since the probe's start
    waiting: float
    kv_usage: float | None = None


@dataclass(frozen=True)
class Stationarity:
    stationary: bool
    reason: str
    waiting_growth: float = 0.0
    kv_growth: float = 0.0


def _slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over x; 0 with fewer than 3 points or no spread in x."""
    if len(points) < 3:
        return 0.0
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


WAITING_GROWTH_FLOOR = 3.0
"""Requests: a fitted rise of the waiting queue below this over a window is noise."""
KV_GROWTH_LIMIT = 0.25
"""Fraction of the KV cache: a fitted rise above this over a window is a ramp, not a plateau."""


def stationarity(samples: Sequence[QueueSample], start: float, end: float) -> Stationarity:
    """Whether the engine was in steady state over [start, end]: the waiting queue's fitted
    rise over the window stays below the larger of a few requests and its own mean (a queue
    that grows without bound rises by about twice its mean), and the KV usage does not climb
    by more than a quarter of the cache. Without samples the window is taken as stationary,
    and the reason says so."""
    inside = [s for s in samples if start <= s.at <= end]
    if len(inside) < 3:
        return Stationarity(True, "not checked: fewer than 3 scrapes of the engine's metrics")
    span = end - start
    waiting = [(s.at, s.waiting) for s in inside]
    rise = _slope(waiting) * span
    mean_waiting = sum(w for _, w in waiting) / len(waiting)
    kv = [(s.at, s.kv_usage) for s in inside if s.kv_usage is not None]
    kv_rise = _slope(kv) * span if kv else 0.0
    if rise > max(WAITING_GROWTH_FLOOR, mean_waiting):
        return Stationarity(
            False,
            f"the waiting queue rose by {rise:.1f} requests over the window (mean "
            f"{mean_waiting:.1f})",
            rise,
            kv_rise,
        )
    if kv_rise > KV_GROWTH_LIMIT:
        return Stationarity(
            False, f"KV-cache usage rose by {kv_rise:.0%} over the window", rise, kv_rise
        )
    return Stationarity(True, "steady", rise, kv_rise)


@dataclass(frozen=True)
class InFlight:
    """A request of a probe's window that is sent and not finished: how long ago it was
    sent, and when its first token came (None while none has)."""

    age: float
    ttft: float | None = None


def _known_late(name: str, request: InFlight, max_seconds: float) -> bool:
    """Whether an unfinished request's sample of `name` is already outside the bound: a first
    token that came late or has not come by the bound, a request older than an e2e bound."""
    if name == "ttft":
        return (request.ttft if request.ttft is not None else request.age) > max_seconds
    if name == "e2e":
        return request.age > max_seconds
    return False  # tpot and itl are known only once the request has finished


def certain_failure(
    slo: SloSpec,
    finished: Sequence[RequestOutcome],
    in_flight: Sequence[InFlight],
    unsent: int,
    confidence: float = CONFIDENCE,
) -> str:
    """Why a probe's window fails whatever its unfinished requests do, or "" while it might
    still pass. Every unfinished or unsent request is taken as within the bound unless it is
    already known late (`_known_late`); if even that best case is a failure, judged over the
    fewest effective samples the window's batches can leave (`MIN_EFFECTIVE`, so no ordering
    of the rest can widen the interval past it), waiting for the rest decides nothing. This is
    what spares a probe far past a configuration's capacity from draining its backlog: there
    the queue makes most of the window late long before it finishes."""
    if len(finished) + len(in_flight) + unsent < MIN_EARLY_WINDOW:
        return ""
    for name, target in slo.targets().items():
        if SLO_METRICS[name].unit != "request":
            continue
        good, total = tally(name, finished, target.max_seconds)
        late = sum(_known_late(name, r, target.max_seconds) for r in in_flight)
        best = good + len(in_flight) - late + unsent
        total += len(in_flight) + unsent
        n = MIN_EFFECTIVE
        high = wilson_interval(best * n / total, n, confidence)[1]
        if high < target.percentile / 100:
            return (
                f"stopped early: {late} unfinished requests already past the {name} bound, so at "
                f"best {best} of {total} within it (under {high:.1%} at {n:g} effective "
                f"samples, {target.percentile:g}% needed)"
            )
    return ""


def probe_decision(
    attainments: Mapping[str, Attainment], steady: Stationarity, can_extend: bool
) -> ProbeVerdict | None:
    """The probe's verdict, or None to extend it. A resolved failure is final even before
    steady state (a longer ramp only makes it worse); a pass needs steady state."""
    verdict = combine([a.verdict for a in attainments.values()])
    if verdict == Verdict.FAIL:
        return ProbeVerdict.FAIL
    if not steady.stationary:
        return None if can_extend else ProbeVerdict.UNSTABLE
    if verdict == Verdict.PASS:
        return ProbeVerdict.PASS
    return None if can_extend else ProbeVerdict.UNRESOLVED


# --- common random numbers ------------------------------------------------------------------


def schedule_seed(seed: int, k: int) -> int:
    """The workload seed of grid index k: the same for every configuration of a study."""
    return seed * 1000 + 500 + k


def scaled_arrivals(seed: int, rate: float, segments: Sequence[int]) -> list[float]:
    """Poisson arrival times (s) for consecutive segments of the given request counts, each
    segment scaled so that its realised rate is exactly `rate`: m arrivals span m / rate
    seconds, so the judged window sends what was asked, whatever the draw."""
    rng = random.Random(f"{seed}:arrivals")  # noqa: S311 - reproducible load, not secrets
    times: list[float] = []
    now = 0.0
    for count in segments:
        gaps = [rng.expovariate(rate) for _ in range(count)]
        scale = (count / rate) / sum(gaps) if gaps and sum(gaps) > 0 else 1.0
        for gap in gaps:
            times.append(now)
            now += gap * scale
    return times


# --- what the tuner asks of a measurement -------------------------------------------------------


@dataclass(frozen=True)
class MeasureRequest:
    """What the tuner asks of one measurement: the study's workload seed (the schedules of
    every rate derive from it), the rate the SLO must carry, whether to measure the engine's
    ceilings first (once per study), the ceiling already known (it caps the rates), and
    whether an infeasible configuration is still bracketed finely (vLLM's defaults are: they
    are the baseline every capacity is compared with)."""

    seed: int
    target_rate: float
    measure_ceiling: bool = False
    ceiling: Ceiling | None = None
    precise: bool = False  # bracket to full precision even when infeasible (the baseline)


def required_rate(rate: float, headroom: float) -> float:
    """The rate a feasible configuration carries: the workload's (or the live peak) rate
    times 1 + headroom."""
    if not rate > 0:
        raise ValueError(f"a capacity search needs a positive request rate, got {rate}")
    return rate * (1 + headroom)


# --- what a trial records ----------------------------------------------------------------------


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class TargetFigures(Record):
    """One target at one probe: attainment and the observed percentile, for people."""

    good: int
    total: int
    low: float
    high: float
    effective: float | None = Field(
        default=None, description="Independent samples the interval counts (batch means)."
    )
    value: float | None = Field(default=None, description="The target percentile, seconds.")


class Probe(Record):
    """One probe of a capacity search."""

    k: int
    rate: float
    sent_rate: float
    verdict: ProbeVerdict
    requests: int
    failed: int = 0
    seconds: float = 0.0
    extended: int = 0
    targets: dict[str, TargetFigures] = Field(default_factory=dict)
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    tpot_p50: float | None = None
    tpot_p95: float | None = None
    output_tps: float = 0.0
    steady: str = ""
    stopped_early: str = Field(
        default="",
        description="Why the probe stopped before its window finished: its failure was certain.",
    )


# The closed-loop concurrency each ceiling is measured at (tuner/measure), which the
# performance model needs to read a decode ceiling as a step time.
PREFILL_CONCURRENCY = 8
DECODE_CONCURRENCY = 64


class Ceiling(Record):
    """The engine's own limits on the workload's shape (vLLM's defaults, once per study)."""

    prefill_tps: float = Field(description="Prompt tokens/s at saturation, max_tokens=1.")
    decode_tps: float = Field(description="Output tokens/s at saturation, short prompts.")
    decode_concurrency: int
    prompt_tokens: float = Field(description="The workload's mean prompt length.")

    @property
    def prefill_rate(self) -> float:
        """Requests/s the prefill ceiling allows for this prompt length."""
        return self.prefill_tps / self.prompt_tokens if self.prompt_tokens else 0.0


class Capacity(Record):
    """A trial's capacity with its bracket and every probe. `capacity` is the highest rate
    that passed (0 when none did); `upper` the lowest that did not (None if all passed): the
    bracket of this engine start. `interval` widens it by the run-to-run spread."""

    capacity: float
    upper: float | None = None  # omitted from a compact record when every probe passed
    target_rate: float
    feasible: bool
    stopped: str
    tokens_per_s: float = 0.0
    probes: list[Probe] = Field(default_factory=list)

    @property
    def interval(self) -> tuple[float, float | None]:
        """[low, high): the capacity another engine start of this configuration would find
        (the bracket widened by `RESTART_SPREAD` grid steps each side; high None if unbounded)."""
        widen = STEP**RESTART_SPREAD
        return self.capacity / widen, None if self.upper is None else self.upper * widen

    def describe(self) -> str:
        low, high = self.interval
        top = f"{high:.3g}" if high is not None else "?"
        probed = f"{self.upper:.3g}" if self.upper is not None else "?"
        return (
            f"{self.capacity:.3g} req/s [{low:.3g}, {top}) "
            f"(bracket [{self.capacity:.3g}, {probed}))"
        )


def capacity_of(settings: SearchSettings, probes: Sequence[Probe]) -> Capacity:
    """The capacity a finished search found."""
    outcomes = {p.k: p.verdict for p in probes}
    b = bracket(outcomes)
    passed = next((p for p in probes if p.k == b.passed), None)
    return Capacity(
        capacity=round(settings.rate(b.passed), 6) if b.passed is not None else 0.0,
        upper=round(settings.rate(b.blocked), 6) if b.blocked is not None else None,
        target_rate=settings.target_rate,
        feasible=outcomes.get(0) == ProbeVerdict.PASS,
        stopped=stop_reason(settings, outcomes),
        tokens_per_s=passed.output_tps if passed else 0.0,
        probes=list(probes),
    )


def attainment_at_upper(found: Capacity) -> float:
    """How near a configuration came to carrying the first rate it did not pass: the worst
    target's attainment (good / total) at that probe. It ranks configurations whose capacities
    tie, as coarse brackets of infeasible ones often do (they end on the same grid rate). 1.0
    where every probe passed; 0.0 where the record kept no figures for that probe (a compact
    record)."""
    if found.upper is None:
        return 1.0
    at_upper = [p for p in found.probes if math.isclose(p.rate, found.upper, rel_tol=1e-3)]
    figures = [t for p in at_upper for t in p.targets.values()]
    if not figures:
        return 0.0
    return min(t.good / t.total if t.total else 0.0 for t in figures)


def overlaps(a: Capacity, b: Capacity) -> bool:
    """Whether two capacity intervals share any rate."""
    (a_low, a_high), (b_low, b_high) = a.interval, b.interval
    return a_low < (math.inf if b_high is None else b_high) and b_low < (
        math.inf if a_high is None else a_high
    )


def above(a: Capacity, b: Capacity) -> float | None:
    """How far a's interval lies above b's: the ratio of a's low end to b's high end when it
    is at least 1, else None (the intervals overlap, or b is unbounded)."""
    a_low, _ = a.interval
    _, b_high = b.interval
    if b_high is None or b_high <= 0 or a_low < b_high:
        return None
    return a_low / b_high
