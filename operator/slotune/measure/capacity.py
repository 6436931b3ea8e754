"""Capacity: the highest request rate, in the workload's shape, at which every SLO target holds.

This is what a trial measures (DistServe's goodput, GuideLLM's `goodput` profile, AIPerf's
boundary search): a number that ranks configurations that all keep up with the target rate,
and says how much headroom a configuration has. It is found within one engine start by probes
at one rate each: bracket, then probes where the fitted crossing lies.

Everything here is pure; `slotune.measure.probe` drives the probes against an engine.

- **The rate grid.** Probes run only at rates `target x (STEP ** (1 / FINE)) ** k` for
  integer k, with the target the workload's rate times (1 + headroom). So every configuration
  probed at a rate sees the same arrivals (common random numbers: the schedule is seeded by
  the study seed and k), and the first probe decides feasibility at once.
- **The search.** From k = 0 it jumps `jump` grid steps (1.59x) up after a pass and down after
  anything else until a pass lies below a non-pass. A configuration that fails the target is
  clearly infeasible: in screening it gets a coarse bracket, enough to rank it, and no more.
  Otherwise each further probe goes where the fitted crossing lies (`next_index`), until its
  interval spans at most `GOAL`, `FITTED` such probes are spent, or `MAX_PROBES` in all.
- **The capacity** is the fitted crossing of the probes' attainments against rate
  (`slotune.measure.crossing`): where the worst target's fitted attainment meets its
  percentile, with a 95% interval from the fit. `interval` widens it by the platform's measured
  spread between engine starts, so it states what the configuration carries; feasibility
  (`AtTarget`), ties and "better than the defaults" (`versus`) are read from it. The bracket of
  verdicts (the highest rate that passed, the lowest that did not) is kept beside it for people.
- **A probe's verdict.** Attainment of every target with a Wilson interval over its effective
  samples (`attainment`: consecutive requests are correlated, batch means measure by how much). A
  probe that is unresolved gets more requests, up to a cap, and stays `Unresolved` after
  that; a probe whose queue or KV usage still climbs at its end, or whose engine preempted
  requests, is extended the same way and stays `Unstable`. Neither counts as a pass, and the
  fit counts an unstable probe as past the capacity.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from slotune.measure import crossing
from slotune.models import SloSpec
from slotune.slo.attainment import (
    CONFIDENCE,
    SLO_METRICS,
    Attainment,
    RequestOutcome,
    Verdict,
    combine,
    tally,
    wilson_interval,
)

STEP = 2 ** (1 / 6)
"""The search's coarse step: six to a doubling, so one step is 12%. Bracketing moves in these."""
FINE = 4
"""Grid points per coarse step: the rate grid is `STEP ** (1 / FINE)`, 2.9% apart, so a probe
placed at the fitted crossing lands within 1.5% of it, and every configuration probed at a
rate still sees the same arrivals there."""
GOAL = 1.15
"""A search is done once its fitted interval (this start, 95%) spans at most this ratio, high
over low: about +-7%. Narrower buys little where engine starts differ by 5% or more
(`Platform.spread`), and each probe costs a window of requests."""
MAX_PROBES = 8
FITTED = 2
"""Probes placed by the fit once the boundary is bracketed. They sit near the crossing, where
a window is usually extended twice, so each costs more than a bracketing probe: with two, a
precise search sends about 1.2x the requests the bracket-and-bisect search did, for a median
error of 3.5% against its 13% (`bench/capacity_simulation.py`; 2.9% with three, 2.2% with
all eight probes of the budget)."""
RESTART_SPREAD = 2
"""Coarse grid steps by which a record made before the fit (a bracket, no estimate) is widened
each side: five fresh engines of vLLM's CPU defaults on five schedules found bracketed
capacities over five grid steps, 2.53-4.01 req/s (`bench/results/capacity-repeatability.md`)."""


MIN_EFFECTIVE = 4.4
"""The fewest effective samples a window of at least MIN_EARLY_WINDOW requests can count,
however its good and bad samples are ordered: batch means over B equal batches give a design
effect of at most N / (B - 1), so B - 1 = 5 effective samples (`attainment.BATCHES`); batches
that differ by a request give a little less (at least 4.49 for every window of 20-400 requests
with its bad samples first, the most clustered order, computed with
`attainment.effective_samples`)."""
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
    step: float = STEP ** (1 / FINE)
    jump: int = 4 * FINE  # grid steps per move while bracketing (x1.59)
    max_probes: int = MAX_PROBES
    min_rate: float | None = None  # below this the search stops: "capacity below min_rate"
    max_rate: float | None = None  # above this no probe is sent (e.g. the prefill ceiling)
    precision: int = FINE  # grid steps between the last pass and the first non-pass to stop
    infeasible_precision: int = 4 * FINE  # the same, once the target rate has not passed
    goal: float = GOAL  # the fitted interval's high/low at which a fitted search stops
    fitted: int = FITTED  # probes placed by the fit, at most

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


def fitting(settings: SearchSettings, outcomes: Mapping[int, ProbeVerdict]) -> bool:
    """Whether the search is past bracketing: its next probe goes where the fit says."""
    b = bracket(outcomes)
    coarse = outcomes.get(0) != ProbeVerdict.PASS and settings.infeasible_precision > (
        settings.precision
    )
    return b.passed is not None and b.blocked is not None and not coarse


def next_index(
    settings: SearchSettings,
    probes: Sequence[Probe],
    percentiles: Mapping[str, float],
) -> int | None:
    """The grid index to probe next with the fit, or None when the search is over.

    Until the verdicts bracket the boundary (a pass below a non-pass), it moves as
    `next_probe` does, and a configuration that failed the target (not bracketed finely) gets
    `next_probe`'s coarse bracket. Then each probe goes where the fitted crossing lies (its
    median, on the grid; a coarse step beyond the rates probed where the interval is open on
    that side), until the fitted interval spans at most `goal` or the budget is spent. The
    verdicts' bracket does not bound it: an unresolved probe is no evidence that the crossing
    lies below it."""
    outcomes = {p.k: p.verdict for p in probes}
    classic = next_probe(settings, outcomes)
    if not outcomes or len(outcomes) >= settings.max_probes:
        return classic
    b = bracket(outcomes)
    if not fitting(settings, outcomes) or b.passed is None or b.blocked is None:
        return classic
    placed = sum(
        fitting(settings, {p.k: p.verdict for p in probes[:i]}) for i in range(len(probes))
    )
    if placed >= settings.fitted:
        return None
    fitted = fit_probes(probes, percentiles)
    if fitted is None:
        return classic
    low, high = fitted.interval()
    if high is not None and low > 0 and high / low <= settings.goal:
        return None
    if high is None:  # nothing probed shows where it ends above: a coarse step up
        wanted = max(outcomes) + settings.precision
    elif low <= 0:  # nor below: a coarse step down
        wanted = min(outcomes) - settings.precision
    else:
        wanted = round(math.log(fitted.estimate / settings.target_rate) / math.log(settings.step))
    lowest, highest = settings.lowest, settings.highest
    for offset in (0, 1, -1, 2, -2):
        k = wanted + offset
        if k in outcomes or (lowest is not None and k < lowest):
            continue
        if highest is not None and k > highest:
            continue
        return k
    return None


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
    preemptions: float | None = None  # the engine's cumulative count


@dataclass(frozen=True)
class Stationarity:
    stationary: bool
    reason: str
    waiting_growth: float = 0.0
    kv_growth: float = 0.0
    preempted: float | None = None  # requests preempted over the window (None: not scraped)
    kv_peak: float | None = None  # the highest KV-cache usage seen over the window


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
    that grows without bound rises by about twice its mean), the KV usage does not climb by
    more than a quarter of the cache, and the engine preempted no request (a preemption means
    the KV cache ran full: the engine recomputes, and requests behind it wait longer and
    longer). Without samples the window is taken as stationary, and the reason says so."""
    inside = [s for s in samples if start <= s.at <= end]
    if len(inside) < 3:
        return Stationarity(True, "not checked: fewer than 3 scrapes of the engine's metrics")
    span = end - start
    waiting = [(s.at, s.waiting) for s in inside]
    rise = _slope(waiting) * span
    mean_waiting = sum(w for _, w in waiting) / len(waiting)
    kv = [(s.at, s.kv_usage) for s in inside if s.kv_usage is not None]
    kv_rise = _slope(kv) * span if kv else 0.0
    kv_peak = max((u for _, u in kv), default=None)
    counts = [s.preemptions for s in inside if s.preemptions is not None]
    preempted = counts[-1] - counts[0] if counts else None
    if rise > max(WAITING_GROWTH_FLOOR, mean_waiting):
        return Stationarity(
            False,
            f"the waiting queue rose by {rise:.1f} requests over the window (mean "
            f"{mean_waiting:.1f})",
            rise,
            kv_rise,
            preempted,
            kv_peak,
        )
    if kv_rise > KV_GROWTH_LIMIT:
        return Stationarity(
            False,
            f"KV-cache usage rose by {kv_rise:.0%} over the window",
            rise,
            kv_rise,
            preempted,
            kv_peak,
        )
    if preempted:
        return Stationarity(
            False,
            f"the engine preempted {preempted:g} requests over the window (KV cache full)",
            rise,
            kv_rise,
            preempted,
            kv_peak,
        )
    return Stationarity(True, "steady", rise, kv_rise, preempted, kv_peak)


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
        if total == 0:  # no sample of this metric yet (e.g. one-token answers have no TPOT)
            continue
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
    spread: float = 0.0  # the platform's between-start spread (`Platform.spread`)


def required_rate(rate: float, headroom: float) -> float:
    """The rate a feasible configuration carries: the workload's (or the live peak) rate
    times 1 + headroom."""
    if not rate > 0:
        raise ValueError(f"a capacity search needs a positive request rate, got {rate}")
    return rate * (1 + headroom)


# --- what a trial records ----------------------------------------------------------------------


class Record(BaseModel):
    # A figure is finite: NaN or infinity, stored as JSON null, would not load back.
    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)


def non_negative(model: BaseModel) -> None:
    """Raises for a negative figure among the model's own float fields (rates, times, counts
    of tokens): no measurement makes one, so one that comes in was not measured."""
    for name, value in model:
        if isinstance(value, float) and value < 0:
            raise ValueError(f"{name} is {value}: a measured figure is never negative")


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
    ttft_p50: float | None = Field(
        default=None, description="Of the finished requests only: `failed` did not finish."
    )
    ttft_p95: float | None = Field(
        default=None,
        description="Of the finished requests only; the attainment (`targets`) counts the "
        "`failed` ones, unfinished included, as outside every bound.",
    )
    tpot_p50: float | None = None
    tpot_p95: float | None = None
    output_tps: float = 0.0
    steady: str = ""
    preempted: float | None = Field(
        default=None, description="Requests the engine preempted over the judged window."
    )
    kv_peak: float | None = Field(
        default=None, description="The highest KV-cache usage (0-1) seen over the window."
    )
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


class AtTarget(StrEnum):
    """Whether a capacity carries the target rate, with the interval's confidence."""

    FEASIBLE = "Feasible"  # the interval lies at or above the target
    INFEASIBLE = "Infeasible"  # it lies below
    UNRESOLVED = "Unresolved"  # it holds the target: counted neither way


class Capacity(Record):
    """A trial's capacity with every probe.

    `estimate`, `low` and `high` are the fitted crossing of the probes' attainments
    (`slotune.measure.crossing`) and its 95% interval for this engine start; `spread` is the
    platform's between-start spread (sd of ln rate), which `interval` adds, so the interval states
    what the configuration carries, not only this start. `capacity` and `upper` are the bracket of
    the probes' verdicts: the highest rate that passed (0 when none did) and the lowest that did not
    (None if all passed). Records made before the fit have only the bracket; their interval is the
    bracket widened by `RESTART_SPREAD` grid steps."""

    capacity: float
    upper: float | None = None  # omitted from a compact record when every probe passed
    target_rate: float
    feasible: bool
    stopped: str
    tokens_per_s: float = 0.0
    probes: list[Probe] = Field(default_factory=list)
    estimate: float | None = Field(default=None, description="The fitted capacity, req/s.")
    low: float | None = Field(default=None, description="This start's interval, low end.")
    high: float | None = Field(default=None, description="Its high end; None: open above.")
    spread: float = Field(default=0.0, description="Between-start sd of ln rate, in `interval`.")
    at_target: AtTarget | None = None
    starts: int = Field(default=1, description="Engine starts pooled into this capacity.")
    agree: bool = Field(
        default=True, description="Whether the pooled starts agree within their intervals."
    )
    apart: float = Field(default=1.0, description="Highest over lowest of the starts' estimates.")

    @model_validator(mode="after")
    def _measured(self) -> Capacity:
        non_negative(self)
        return self

    @property
    def rate(self) -> float:
        """The capacity in req/s: the fitted estimate, or the bracket's pass without a fit."""
        return self.estimate if self.estimate is not None else self.capacity

    @property
    def fitted(self) -> bool:
        return self.estimate is not None and self.low is not None

    @property
    def bracket_interval(self) -> tuple[float, float | None]:
        """The bracket widened by `RESTART_SPREAD` grid steps each side (before the fit)."""
        widen = STEP**RESTART_SPREAD
        return self.capacity / widen, None if self.upper is None else self.upper * widen

    @property
    def interval(self) -> tuple[float, float | None]:
        """[low, high): what the configuration carries, this start's interval combined with the
        between-start spread (high None where open)."""
        if self.estimate is None or self.low is None:
            return self.bracket_interval
        return crossing.widen(self.estimate, self.low, self.high, self.spread)

    def pooled(self) -> crossing.Pooled:
        """This capacity as the pooled mean of its starts (`crossing.pool`)."""
        if self.estimate is None or self.low is None:
            low, high = self.bracket_interval
            return crossing.pool([(max(self.capacity, 1e-9), low, high)], 0.0)
        single = crossing.pool([(self.estimate, self.low, self.high)], self.spread)
        return replace(
            single,
            agree=self.agree,
            starts=self.starts,
            apart=self.apart,
            open_below=single.open_below or (self.low or 0.0) <= 0,
        )

    @property
    def verdict(self) -> str:
        """Whether it carries the target, in words."""
        if self.at_target == AtTarget.UNRESOLVED:
            return "unresolved at the target"
        return "feasible" if self.feasible else "infeasible"

    def describe(self) -> str:
        low, high = self.interval
        top = f"{high:.3g}" if high is not None else "?"
        probed = f"{self.upper:.3g}" if self.upper is not None else "?"
        return f"{self.rate:.3g} req/s [{low:.3g}, {top}] (bracket [{self.capacity:.3g}, {probed}))"


def at_target(interval: tuple[float, float | None], target: float) -> AtTarget:
    low, high = interval
    if low >= target:
        return AtTarget.FEASIBLE
    if high is not None and high < target:
        return AtTarget.INFEASIBLE
    return AtTarget.UNRESOLVED


QUEUED = frozenset({"ttft", "e2e"})
"""The targets whose samples include the time a request waits in the engine's queue."""


def observations(
    probes: Sequence[Probe], name: str, percentile: float | None = None
) -> list[crossing.Observation]:
    """One target's attainment at each probe, as the fit reads it, and (given the target's
    percentile) whether the probe's own interval passed or failed it. A probe whose engine
    never reached steady state (its waiting queue or KV usage still climbing) is past the
    capacity for the targets a queue delays, whatever its window's requests saw so far: in
    steady state the queue would make every first token (and every whole request) late, so
    for TTFT and e2e it counts as no sample within the bound. Its inter-token gaps and TPOT
    are what they were (a queue of waiting requests does not slow the running ones)."""
    found = []
    for p in probes:
        t = p.targets.get(name)
        if t is None or t.total <= 0:
            continue
        effective = t.effective if t.effective is not None else float(t.total)
        unsteady = p.verdict == ProbeVerdict.UNSTABLE and name in QUEUED
        good = 0 if unsteady else t.good
        needed = None if percentile is None else percentile / 100
        failed = needed is not None and (unsteady or t.high < needed)
        passed = needed is not None and not unsteady and t.low >= needed
        # Past the capacity a window's queue had not yet made every request late when it
        # ended (stopped early, often): for the targets it delays, the attainment seen is a
        # bound the steady state lies under, not the curve's value there.
        at_most = failed and name in QUEUED
        found.append(
            crossing.Observation(p.rate, good, t.total, effective, failed, passed, at_most)
        )
    return found


def fit_probes(probes: Sequence[Probe], percentiles: Mapping[str, float]) -> crossing.Fit | None:
    """The fitted capacity of a search's probes, every target at its percentile."""
    return crossing.fit(
        {name: (q, observations(probes, name, q)) for name, q in percentiles.items()}
    )


def capacity_of(
    settings: SearchSettings,
    probes: Sequence[Probe],
    percentiles: Mapping[str, float] | None = None,
    spread: float = 0.0,
) -> Capacity:
    """The capacity a finished search found: the bracket of its verdicts and, given each
    target's percentile, the fitted crossing with its interval; feasible when the interval
    (with the between-start `spread`) lies at or above the target."""
    outcomes = {p.k: p.verdict for p in probes}
    b = bracket(outcomes)
    passed = next((p for p in probes if p.k == b.passed), None)
    found = Capacity(
        capacity=round(settings.rate(b.passed), 6) if b.passed is not None else 0.0,
        upper=round(settings.rate(b.blocked), 6) if b.blocked is not None else None,
        target_rate=settings.target_rate,
        feasible=outcomes.get(0) == ProbeVerdict.PASS,
        stopped=stop_reason(settings, outcomes),
        tokens_per_s=passed.output_tps if passed else 0.0,
        probes=list(probes),
        spread=spread,
    )
    fitted = fit_probes(probes, percentiles or {})
    if fitted is None:
        return found
    low, high = fitted.interval()
    return with_fit(found, fitted.estimate, low, high)


def with_fit(found: Capacity, estimate: float, low: float, high: float | None) -> Capacity:
    """`found` with a fitted estimate and interval, and its verdict at the target from them."""
    fitted = found.model_copy(
        update={
            "estimate": round(estimate, 6),
            "low": round(low, 6),
            "high": None if high is None else round(high, 6),
        }
    )
    verdict = at_target(fitted.interval, found.target_rate)
    return fitted.model_copy(
        update={"at_target": verdict, "feasible": verdict == AtTarget.FEASIBLE}
    )


def pool_starts(first: Capacity, again: Capacity) -> Capacity:
    """One configuration's capacity over two engine starts: the pooled mean of their fitted
    estimates (`crossing.pool`, each start weighed by its interval and the between-start
    spread), its interval that of the configuration's mean, and its verdict at the target from
    that. The bracket shown beside it is the lower of the two, its upper end the higher (the
    range the probes saw). Records without a fit pool as before the fit: the higher pass where
    the brackets agree, else the lower."""
    agree = (again.upper is None or first.capacity < again.upper) and (
        first.upper is None or again.capacity < first.upper
    )
    low_pass, high_pass = sorted((first, again), key=lambda c: c.capacity)
    chosen = high_pass if agree else low_pass
    upper = None if first.upper is None or again.upper is None else max(first.upper, again.upper)
    merged = chosen.model_copy(update={"upper": upper, "probes": [], "starts": 2})
    if not (first.fitted and again.fitted):
        return merged
    pooled = crossing.pool(
        [(c.rate, c.low or 0.0, c.high) for c in (first, again)],
        max(first.spread, again.spread),
    )
    low, high = pooled.interval()
    verdict = at_target((low, high), first.target_rate)
    return merged.model_copy(
        update={
            "capacity": low_pass.capacity,
            "estimate": round(pooled.estimate, 6),
            "low": round(low, 6),
            "high": None if high is None else round(high, 6),
            "spread": 0.0,  # the pooled interval is the configuration's: spread included
            "at_target": verdict,
            "feasible": verdict == AtTarget.FEASIBLE,
            "agree": pooled.agree,
            "apart": round(pooled.apart, 4),
        }
    )


def versus(a: Capacity, b: Capacity) -> crossing.Comparison:
    """A's capacity over B's, paired verdict and all (`crossing.compare`)."""
    return crossing.compare(a.pooled(), b.pooled())


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
