"""Capacity as a fitted crossing: the rate at which a target's attainment, fitted against rate
over every probe of a search, crosses the target's percentile; with its interval.

A probe's verdict (pass, fail, unresolved) throws away how far its attainment sat from the
percentile, and a bracket of verdicts can only say "between two grid rates". The attainments
themselves say more: 97% within the bound at one rate and 80% at the next place the crossing
near the first. So every probe's attainment of every target feeds one model per target:

    A(r) = sigmoid(logit(q) - s * (ln r - ln c))

with q the target's percentile (0.95 for p95), c the crossing (A(c) = q: the capacity as that
target sees it) and s > 0 the steepness; or the power law 1 - A(r) = (1 - q) (r / c)^s, which
agrees with it near the crossing and overloads faster beyond it (`_curves`: the prior holds
both). Each is monotone in the rate by construction, as attainment is (more load never makes
latency better). A probe with a fraction f of its samples
within the bound, worth e independent samples (`attainment.effective_samples`: batch means over
the probe's requests in arrival order), adds the quasi-binomial log-likelihood
e * (f ln A + (1 - f) ln(1 - A)), so a probe counts as much as its own variance says it should.

The posterior over (ln c, s) is computed on a grid, as psychophysics' QUEST and Psi methods
do for the same problem (a threshold under binary responses): flat in ln c over a range around
the rates probed, log-uniform in s. Marginalised over s it gives each target's crossing a
distribution; the capacity is the lowest crossing of all targets (every target must hold), its
distribution the product of the targets' survival functions. The estimate is its median and the
interval its central 95%: the uncertainty of this engine start's capacity under these arrivals.
Another engine start adds its own spread (`Spread`), measured per platform; `widen` combines
the two, and `compare` judges two capacities against each other with both.

Everything here is pure (numpy only): the search in `slotune.measure.capacity` calls it on its
probes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

CONFIDENCE = 0.95
"""Central probability of a stated interval."""

GRID_STEP = 0.004
"""Spacing of the ln-crossing grid: 0.4% of a rate, well below any resolution claimed."""
RANGE = math.log(2.0)
"""The grid reaches this far (in ln rate) beyond the lowest and highest rates probed. The
model extrapolates no further: an interval end that reaches the grid's edge is stated as
unbounded (above) or 0 (below), not as a figure."""
EDGE = math.log(1.25)
"""An interval end further than this beyond the rates probed is extrapolation: unbounded."""
SLOPES = np.geomspace(0.5, 300.0, 36)
"""Steepness values of each side's grid (logit per unit of ln rate). 0.5: attainment moves from
95% to 50% over a 360x range of rates; 300: over 1%. A queue's onset on a real engine lies
between."""
MIN_P = 1e-9
ABOVE_FAILURE = math.log(2 ** (1 / 6))
"""How far above the lowest rate at which a target's own verdict failed (its attainment
interval wholly below the percentile) its crossing may lie, and below the highest at which it
passed: one coarse step of the search, 12%. Attainment falls with rate, so a resolved failure
bounds the crossing from above and a resolved pass from below; the step allows for a verdict
that was noise. Without the bounds a soft failure at the highest probe left the interval open
above (a crossing beyond every probe leaves the upper slope unconstrained, and the slope
prior's breadth then favours it over one the data pins down), and an outlying probe could
put the crossing below rates that passed."""
STUDENT_975 = {4: 2.7764451052, 5: 2.5705818366, 6: 2.4469118511, 7: 2.3646242510,
               8: 2.3060041350, 9: 2.2621571628}  # fmt: skip
"""Student's t at 97.5% by degrees of freedom."""
BATCH_DEGREES = 5
"""The degrees of freedom of a probe's variance: `attainment.BATCHES` - 1 (a unit test holds
the two together)."""
TEMPER = (NormalDist().inv_cdf(0.975) / STUDENT_975[BATCH_DEGREES]) ** 2
"""Each probe's log-likelihood is scaled by (z / t)^2, with t Student's 97.5% point at the
batch means' degrees of freedom: a probe's effective samples come from the spread of B batch
means, a variance estimated with B - 1 degrees of freedom, and taking it as known would state
intervals narrower than they are (the simulation's coverage, `bench/capacity_simulation.py`)."""

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Observation:
    """One target at one probe: `good` of `total` samples within the bound, worth `effective`
    independent samples."""

    rate: float
    good: float
    total: float
    effective: float
    failed: bool = False  # the probe's own verdict for this target: its interval lay below
    passed: bool = False  # ... or wholly at or above the percentile
    at_most: bool = False
    """The attainment seen is an upper bound of the curve's: a window past the capacity ends
    before its queue has made every request late, so what it saw overstates the steady state.
    Such a probe says only that the curve lies at or below it there."""

    def __post_init__(self) -> None:
        for name in ("rate", "good", "total", "effective"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"an observation's {name} must be finite and >= 0, got {value}")
        if self.good > self.total:
            raise ValueError(f"good ({self.good}) exceeds total ({self.total})")
        if self.rate <= 0:
            raise ValueError(f"an observation's rate must be > 0, got {self.rate}")

    @property
    def weight(self) -> float:
        """Effective samples, never more than the raw count."""
        return min(self.effective, self.total)


@dataclass(frozen=True)
class Fit:
    """The capacity's distribution on a grid of ln rates, and what it says."""

    log_rates: Floats
    cdf: Floats
    probed: tuple[float, float]  # lowest and highest rate probed

    def quantile(self, q: float) -> float:
        """The rate below which the capacity lies with probability q."""
        index = int(np.searchsorted(self.cdf, q, side="left"))
        index = min(max(index, 0), len(self.log_rates) - 1)
        if index == 0:
            return float(math.exp(self.log_rates[0]))
        c0, c1 = self.cdf[index - 1], self.cdf[index]
        x0, x1 = self.log_rates[index - 1], self.log_rates[index]
        x = x1 if c1 <= c0 else x0 + (q - c0) / (c1 - c0) * (x1 - x0)
        return float(math.exp(x))

    def probability_below(self, rate: float) -> float:
        """P(capacity < rate)."""
        return float(np.interp(math.log(rate), self.log_rates, self.cdf, left=0.0, right=1.0))

    @property
    def estimate(self) -> float:
        """The median, but never above the highest rate probed while the interval is open
        above (every probe held there: the capacity is at least that, and the model's guess of
        how far beyond is no measurement)."""
        median = self.quantile(0.5)
        if self.interval()[1] is None:
            return min(median, self.probed[1])
        return median

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float | None]:
        """[low, high] of this engine start's capacity; low 0 and high None where the interval
        runs past what the probes can say (`EDGE` beyond the rates probed)."""
        tail = (1 - confidence) / 2
        low, high = self.quantile(tail), self.quantile(1 - tail)
        lowest, highest = self.probed
        if high > highest * math.exp(EDGE):  # open above: no claim beyond what was probed
            return (0.0 if low < lowest / math.exp(EDGE) else min(low, highest)), None
        return (0.0 if low < lowest / math.exp(EDGE) else low), high


def _log_sigmoid(z: Floats) -> Floats:
    return -np.logaddexp(0.0, -z)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _grid(observations: Sequence[Observation]) -> Floats:
    rates = [math.log(o.rate) for o in observations]
    low, high = min(rates) - RANGE, max(rates) + RANGE
    count = math.ceil((high - low) / GRID_STEP) + 1
    return np.linspace(low, high, count)


def crossing_cdf(
    observations: Sequence[Observation], percentile: float, log_rates: Floats
) -> Floats:
    """P(crossing <= x) for each x of `log_rates` (ascending), for one target whose
    attainment must reach `percentile` (in %). Observations with no samples are left out;
    with none left, the distribution is flat over the grid.

    The steepness may differ on the two sides of the crossing (a queue's onset is often
    sharper above its capacity than the slow rise of slow requests below it), so the curve is
    two half-logistics that meet at the crossing, each side's slope with its own log-uniform
    prior. The likelihood then separates: the probes below a candidate crossing speak only to
    the lower slope, those above to the upper one, and each is marginalised on its own."""
    q = percentile / 100
    if not 0 < q < 1:
        raise ValueError(f"percentile must be within (0, 100), got {percentile}")
    used = [o for o in observations if o.total > 0 and o.weight > 0]
    if not used:
        return np.asarray(np.linspace(0.0, 1.0, len(log_rates)), dtype=np.float64)
    log_r = np.array([math.log(o.rate) for o in used])[None, None, :]
    fraction = np.array([o.good / o.total for o in used])[None, None, :]
    weight = np.array([o.weight for o in used])[None, None, :]
    x = log_r - log_rates[:, None, None]  # the probe's rate over the candidate crossing
    log_a, log_not = _curves(q, x)
    # An upper bound: the likelihood of the highest attainment the window allows, max(A, f),
    # so that a curve at or below what was seen costs nothing and one above it what it would.
    bound = np.array([o.at_most for o in used])[None, None, :]
    seen = np.clip(fraction, MIN_P, 1 - MIN_P)
    log_a = np.where(bound, np.maximum(log_a, np.log(seen)), log_a)
    log_not = np.where(bound, np.minimum(log_not, np.log1p(-seen)), log_not)
    each = TEMPER * weight * (fraction * log_a + (1 - fraction) * log_not)  # crossing, slope, probe
    below = np.where(x < 0, each, 0.0).sum(axis=2)
    above = np.where(x >= 0, each, 0.0).sum(axis=2)
    log_mass = _log_mean_exp(below) + _log_mean_exp(above)
    failures = [math.log(o.rate) for o in used if o.failed]
    passes = [math.log(o.rate) for o in used if o.passed]
    top = min(failures) + ABOVE_FAILURE if failures else math.inf
    bottom = max(passes) - ABOVE_FAILURE if passes else -math.inf
    if bottom >= top:  # the verdicts contradict each other by more than a step: no bound
        top, bottom = math.inf, -math.inf
    inside = (log_rates <= top) & (log_rates >= bottom)
    if inside.any():
        log_mass = np.where(inside, log_mass, -np.inf)
    mass = np.exp(log_mass - log_mass.max())
    cdf = np.cumsum(mass)
    return np.asarray(cdf / cdf[-1], dtype=np.float64)


def _curves(q: float, x: Floats) -> tuple[Floats, Floats]:
    """ln A and ln (1 - A) at each probe's ln rate over a candidate crossing (`x`), for every
    curve of the prior (axis 1): the logistic in ln rate at each of `SLOPES`, then the power
    law in the violation rate, 1 - A = (1 - q) (r / c)^s, at each of them. The two agree near
    the crossing and part far from it: a logistic's misses approach 1 as slowly as they left
    0, a power law's reach every request within a few multiples of the crossing (a queue's
    overload). Fitted with one form only, probes far above the crossing pull it towards them
    when the engine's curve is the other (`bench/capacity_simulation.py`)."""
    slopes = SLOPES[None, :, None]
    z = _logit(q) - slopes * x
    floor = math.log(MIN_P)
    logistic_a = np.maximum(_log_sigmoid(z), floor)
    logistic_not = np.maximum(_log_sigmoid(-z), floor)
    power_not = np.minimum(math.log(1 - q) + slopes * x, math.log1p(-MIN_P))
    power_a = np.maximum(np.log1p(-np.exp(power_not)), floor)
    power_not = np.maximum(power_not, floor)
    return (
        np.concatenate([logistic_a, power_a], axis=1),
        np.concatenate([logistic_not, power_not], axis=1),
    )


def _log_mean_exp(values: Floats) -> Floats:
    """ln of the mean over the slopes (axis 1) of exp(values), computed stably."""
    top = values.max(axis=1, keepdims=True)
    return np.asarray((top[:, 0] + np.log(np.exp(values - top).mean(axis=1))), dtype=np.float64)


def fit(targets: Mapping[str, tuple[float, Sequence[Observation]]]) -> Fit | None:
    """The capacity's distribution: the lowest crossing of every target (name -> (percentile,
    its observations)). A target without a sample (TPOT of one-token answers) says nothing and
    is left out; None when no target has one."""
    usable = {
        name: (percentile, used)
        for name, (percentile, observations) in targets.items()
        if (used := [o for o in observations if o.total > 0 and o.weight > 0])
    }
    every = [o for _, observations in usable.values() for o in observations]
    if not every:
        return None
    log_rates = _grid(every)
    survival = np.ones_like(log_rates)
    for percentile, observations in usable.values():
        survival = survival * (1 - crossing_cdf(observations, percentile, log_rates))
    rates = [o.rate for o in every]
    return Fit(log_rates, 1 - survival, (min(rates), max(rates)))


# --- across engine starts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """How much one configuration's capacity moves between engine starts, beyond what one
    start's interval holds: a log-normal factor with standard deviation `sigma` (in ln rate),
    measured on `platform` from `starts` fresh engines (`bench/capacity_repeatability.py`)."""

    sigma: float
    starts: int
    source: str

    def __post_init__(self) -> None:
        if not math.isfinite(self.sigma) or self.sigma < 0:
            raise ValueError(f"a spread's sigma must be finite and >= 0, got {self.sigma}")


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def half_widths(estimate: float, low: float, high: float | None) -> tuple[float, float]:
    """The interval's two half-widths in ln rate (inf where it is open)."""
    below = math.log(estimate / low) if low > 0 else math.inf
    above = math.log(high / estimate) if high is not None else math.inf
    return below, above


def widen(
    estimate: float,
    low: float,
    high: float | None,
    sigma: float,
    confidence: float = CONFIDENCE,
) -> tuple[float, float | None]:
    """What another engine start of the same configuration would find: each half-width of
    this start's interval (ln rate) combined in quadrature with the between-start spread's,
    z * sigma. (An open end stays open.)"""
    z = _z(confidence)
    below, above = half_widths(estimate, low, high)
    spread = z * sigma
    new_low = estimate / math.exp(math.hypot(below, spread)) if math.isfinite(below) else 0.0
    new_high = estimate * math.exp(math.hypot(above, spread)) if math.isfinite(above) else None
    return new_low, new_high


def log_sd(
    estimate: float, low: float, high: float | None, confidence: float = CONFIDENCE
) -> float:
    """The standard deviation (ln rate) an interval implies, read from its narrower side (an
    open side says nothing); inf when both are open."""
    below, above = half_widths(estimate, low, high)
    return min(below, above) / _z(confidence)


@dataclass(frozen=True)
class Pooled:
    """One configuration's capacity over one or more engine starts: the inverse-variance mean
    of their ln estimates, each weighed by its own interval and the between-start spread, and
    whether the starts agree with one another (Cochran's Q within the chi-square's 95%)."""

    estimate: float
    sd: float  # of ln(estimate): the configuration's capacity, not one start's
    open_above: bool
    agree: bool
    starts: int
    apart: float = 1.0  # highest over lowest estimate of the starts
    open_below: bool = False

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float | None]:
        z = _z(confidence)
        if not math.isfinite(self.sd):
            return 0.0, None
        return (
            0.0 if self.open_below else self.estimate / math.exp(z * self.sd),
            None if self.open_above else self.estimate * math.exp(z * self.sd),
        )


AGREE_Q = (1.959963984540054**2, 5.991464547107979, 7.814727903251178, 9.487729036781154)
"""Cochran's Q at the chi-square's 95% point for 1-4 degrees of freedom (2-5 starts)."""


def pool(
    measured: Sequence[tuple[float, float, float | None]],
    sigma: float,
    confidence: float = CONFIDENCE,
) -> Pooled:
    """Pools (estimate, low, high) of one configuration's engine starts, each with its own
    interval's standard deviation and `sigma` between starts."""
    if not measured:
        raise ValueError("pooling needs at least one measurement")
    logs, weights = [], []
    for estimate, low, high in measured:
        if not estimate > 0:
            continue
        variance = log_sd(estimate, low, high, confidence) ** 2 + sigma**2
        logs.append(math.log(estimate))
        weights.append(0.0 if not math.isfinite(variance) else 1 / max(variance, 1e-12))
    if not logs or sum(weights) == 0:
        best = max(m[0] for m in measured)
        return Pooled(best, math.inf, True, True, len(measured), open_below=True)
    total = sum(weights)
    mean = sum(w * x for w, x in zip(weights, logs, strict=True)) / total
    q = sum(w * (x - mean) ** 2 for w, x in zip(weights, logs, strict=True))
    used = sum(1 for w in weights if w > 0)
    agree = used < 2 or q <= AGREE_Q[min(used - 2, len(AGREE_Q) - 1)]
    sd = math.sqrt(1 / total)
    if not agree:  # the starts spread more than their intervals say: widen by Birge's ratio
        sd *= math.sqrt(q / (used - 1))
    return Pooled(
        math.exp(mean),
        sd,
        all(high is None for _, _, high in measured),
        agree,
        len(measured),
        math.exp(max(logs) - min(logs)),
        all(low <= 0 for _, low, _ in measured),
    )


class Difference(StrEnum):
    BETTER = "Better"
    WORSE = "Worse"
    NONE = "NoDifference"  # the gap is within the resolution
    UNSTABLE = "Unstable"  # one side's repeats disagree by more than the gap


@dataclass(frozen=True)
class Comparison:
    """A's capacity over B's: the ratio with its interval, and the verdict people read."""

    verdict: Difference
    ratio: float
    low: float
    high: float
    resolution: float  # the smallest ratio this comparison could tell from 1 (e^(z sd))

    def describe(self) -> str:
        top = f"{self.high:.2f}" if math.isfinite(self.high) else "open"
        span = f"[{self.low:.2f}, {top}]"
        if self.verdict == Difference.BETTER:
            return f"better by {self.ratio - 1:.0%} ({self.ratio:.2f}x {span})"
        if self.verdict == Difference.WORSE:
            return f"worse by {1 - self.ratio:.0%} ({self.ratio:.2f}x {span})"
        if self.verdict == Difference.UNSTABLE:
            return f"unstable: repeats disagree by more than the gap ({self.ratio:.2f}x {span})"
        if not math.isfinite(self.resolution):
            return "cannot be told apart: an interval is open"
        return (
            f"no meaningful difference ({self.ratio:.2f}x {span}; resolution "
            f"±{self.resolution - 1:.0%})"
        )


def compare(a: Pooled, b: Pooled, confidence: float = CONFIDENCE) -> Comparison:
    """A's capacity against B's, each the pooled mean of its engine starts. The two are
    measured on the same arrival schedules (common random numbers), which makes their errors
    positively correlated; the variance of the ratio is taken as the sum of the two (their
    covariance left out), so the interval is conservative."""
    z = _z(confidence)
    ratio = a.estimate / b.estimate
    sd = math.hypot(a.sd, b.sd)
    if not math.isfinite(sd):
        return Comparison(Difference.NONE, ratio, 0.0, math.inf, math.inf)
    low, high = ratio / math.exp(z * sd), ratio * math.exp(z * sd)
    # An open end says "at least" or "at most": the ratio is open on that side too.
    if a.open_above or b.open_below:
        high = math.inf
    if a.open_below or b.open_above:
        low = 0.0
    resolution = math.exp(z * sd)
    gap = max(ratio, 1 / ratio)
    if any(not side.agree and side.apart >= gap for side in (a, b)):
        verdict = Difference.UNSTABLE
    elif low > 1:
        verdict = Difference.BETTER
    elif high < 1:
        verdict = Difference.WORSE
    else:
        verdict = Difference.NONE
    return Comparison(verdict, ratio, low, high, resolution)
