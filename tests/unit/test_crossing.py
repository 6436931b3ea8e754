"""The fitted capacity: the crossing of attainment against rate, its interval, where a search
places its probes with it, and the paired verdict between two capacities."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from slotune.measure import capacity, crossing
from slotune.measure.capacity import Probe, ProbeVerdict, SearchSettings, TargetFigures
from slotune.measure.crossing import Difference, Observation
from slotune.slo import attainment

P95 = 95.0


def curve(rate: float, crossing_rate: float, steep: float = 15.0) -> float:
    """Attainment of a p95 target whose crossing is `crossing_rate`."""
    z = math.log(0.95 / 0.05) - steep * math.log(rate / crossing_rate)
    return 1 / (1 + math.exp(-z))


def observe(rate: float, truth: float, count: int = 400) -> Observation:
    """The expected attainment at `rate`, as `count` independent samples."""
    good = round(curve(rate, truth) * count)
    return Observation(rate, good, count, count)


# --- the fit ------------------------------------------------------------------------------------


def test_the_fit_finds_the_crossing_between_two_probes() -> None:
    """Attainments of 97.6% and 83.5% put the crossing near the first (their verdicts, a pass
    and a fail, could only say 'between')."""
    truth = 4.2
    fitted = crossing.fit({"ttft": (P95, [observe(r, truth) for r in (3.0, 4.0, 4.8)])})
    assert fitted is not None
    assert fitted.estimate == pytest.approx(truth, rel=0.03)
    low, high = fitted.interval()
    assert high is not None
    assert low < truth < high
    assert high / low < 1.25


def test_more_samples_narrow_the_interval_and_keep_the_truth() -> None:
    truth = 2.0
    rates = (1.6, 1.9, 2.1, 2.5)
    few = crossing.fit({"ttft": (P95, [observe(r, truth, 60) for r in rates])})
    many = crossing.fit({"ttft": (P95, [observe(r, truth, 2000) for r in rates])})
    assert few is not None
    assert many is not None
    (few_low, few_high), (low, high) = few.interval(), many.interval()
    assert few_high is not None
    assert high is not None
    assert high / low < few_high / few_low
    assert low < truth < high


def test_correlated_samples_count_as_fewer() -> None:
    """The same attainments over fewer effective samples give a wider interval."""
    truth = 3.0
    independent = [observe(r, truth) for r in (2.5, 3.0, 3.5)]
    clustered = [Observation(o.rate, o.good, o.total, o.total / 8) for o in independent]
    a = crossing.fit({"ttft": (P95, independent)})
    b = crossing.fit({"ttft": (P95, clustered)})
    assert a is not None
    assert b is not None
    (a_low, a_high), (b_low, b_high) = a.interval(), b.interval()
    assert a_high is not None
    assert b_high is not None
    assert b_high / b_low > a_high / a_low


def test_the_lowest_target_sets_the_capacity() -> None:
    rates = (2.0, 3.0, 4.0, 5.0)
    low_target = [observe(r, 3.0) for r in rates]
    high_target = [observe(r, 4.5) for r in rates]
    both = crossing.fit({"ttft": (P95, low_target), "itl": (P95, high_target)})
    alone = crossing.fit({"ttft": (P95, low_target)})
    assert both is not None
    assert alone is not None
    assert both.estimate == pytest.approx(alone.estimate, rel=0.02)
    assert both.estimate == pytest.approx(3.0, rel=0.03)


def test_every_probe_passing_leaves_the_interval_open_above() -> None:
    passes = [Observation(r, 100, 100, 100) for r in (1.0, 1.6, 2.5)]
    fitted = crossing.fit({"ttft": (P95, passes)})
    assert fitted is not None
    low, high = fitted.interval()
    assert high is None
    assert low > 1.0  # 100 of 100 at 2.5 req/s: p95 holds there with confidence


def test_no_probe_passing_leaves_it_open_below() -> None:
    fails = [Observation(r, 10, 100, 100) for r in (1.0, 1.6, 2.5)]
    fitted = crossing.fit({"ttft": (P95, fails)})
    assert fitted is not None
    low, high = fitted.interval()
    assert low == 0.0
    assert high is not None
    assert high < 1.0


@pytest.mark.parametrize(
    "bad",
    [
        {"rate": math.nan},
        {"rate": 0.0},
        {"good": math.inf},
        {"good": -1.0},
        {"total": math.nan},
        {"good": 5.0, "total": 4.0},
        {"effective": -2.0},
    ],
)
def test_an_observation_refuses_what_no_probe_can_see(bad: dict[str, float]) -> None:
    fields = {"rate": 1.0, "good": 3.0, "total": 4.0, "effective": 4.0} | bad
    with pytest.raises(ValueError, match=r"observation|exceeds"):
        Observation(**fields)


def test_no_input_crashes_the_estimator() -> None:
    """Empty probes, probes without samples, every request failed, one probe: an answer, never
    an exception."""
    assert crossing.fit({}) is None
    assert crossing.fit({"ttft": (P95, [])}) is None
    assert crossing.fit({"ttft": (P95, [Observation(2.0, 0, 0, 0)])}) is None
    failed = crossing.fit({"ttft": (P95, [Observation(2.0, 0, 50, 50)])})
    assert failed is not None
    assert failed.estimate < 2.0
    rng = random.Random(7)  # noqa: S311 - reproducible test data
    for _ in range(200):
        observations = [
            Observation(
                rng.uniform(0.01, 100),
                good := rng.randint(0, 50),
                good + rng.randint(0, 50),
                rng.uniform(0, 60),
            )
            for _ in range(rng.randint(1, 8))
        ]
        fitted = crossing.fit({"ttft": (rng.uniform(1, 99.9), observations)})
        assert fitted is not None
        low, high = fitted.interval()
        assert 0 <= low <= fitted.estimate
        assert high is None or fitted.estimate <= high


# --- across starts --------------------------------------------------------------------------


def test_the_between_start_spread_widens_an_interval_in_quadrature() -> None:
    low, high = crossing.widen(10.0, 9.5, 10.5, 0.0)
    assert (low, high) == pytest.approx((9.5, 10.5))
    low, high = crossing.widen(10.0, 9.5, 10.5, 0.05)
    assert high is not None
    assert low < 9.5
    assert high > 10.5
    z = 1.959963984540054
    assert math.log(high / 10) == pytest.approx(math.hypot(math.log(1.05), z * 0.05))
    assert crossing.widen(10.0, 9.5, None, 0.05)[1] is None


def test_pooled_starts_narrow_and_disagreeing_starts_are_flagged() -> None:
    one = crossing.pool([(10.0, 9.5, 10.5)], 0.02)
    two = crossing.pool([(10.0, 9.5, 10.5), (10.2, 9.7, 10.7)], 0.02)
    assert two.sd < one.sd
    assert two.agree
    apart = crossing.pool([(10.0, 9.8, 10.2), (14.0, 13.7, 14.3)], 0.02)
    assert not apart.agree
    assert apart.apart == pytest.approx(1.4)


# --- the paired verdict ---------------------------------------------------------------------


def test_the_paired_verdict_reads_better_worse_or_no_difference() -> None:
    base = crossing.pool([(10.0, 9.6, 10.4)], 0.02)
    better = crossing.pool([(12.0, 11.5, 12.5)], 0.02)
    close = crossing.pool([(10.3, 9.9, 10.7)], 0.02)
    found = crossing.compare(better, base)
    assert found.verdict == Difference.BETTER
    assert found.low > 1
    assert found.ratio == pytest.approx(1.2)
    assert found.describe().startswith("better by 20% (1.20x [")
    assert crossing.compare(base, better).verdict == Difference.WORSE
    same = crossing.compare(close, base)
    assert same.verdict == Difference.NONE
    assert same.low < 1 < same.high
    assert "resolution" in same.describe()
    # A side whose repeats disagree by more than the gap: unstable.
    wobbly = crossing.pool([(9.0, 8.9, 9.1), (12.0, 11.9, 12.1)], 0.0)
    assert crossing.compare(wobbly, base).verdict == Difference.UNSTABLE


def test_capacities_compare_through_their_fits() -> None:
    def fitted(estimate: float, low: float, high: float) -> capacity.Capacity:
        found = capacity.Capacity(
            capacity=low, upper=high, target_rate=5.0, feasible=False, stopped="-", spread=0.02
        )
        return capacity.with_fit(found, estimate, low, high)

    a, b = fitted(7.0, 6.8, 7.2), fitted(6.0, 5.8, 6.2)
    assert a.at_target == capacity.AtTarget.FEASIBLE
    assert a.feasible
    assert capacity.versus(a, b).verdict == Difference.BETTER
    both = capacity.pool_starts(a, fitted(7.2, 7.0, 7.4))
    assert both.starts == 2
    assert both.agree
    assert 7.0 < both.rate < 7.2
    edge = fitted(5.1, 4.8, 5.4)
    assert edge.at_target == capacity.AtTarget.UNRESOLVED
    assert not edge.feasible
    assert edge.verdict == "unresolved at the target"


# --- placement --------------------------------------------------------------------------------


def probe_at(settings: SearchSettings, k: int, truth: float, count: int = 200) -> Probe:
    rate = settings.rate(k)
    o = observe(rate, truth, count)
    low, high = crossing_wilson(o.good, o.total)
    verdict = (
        ProbeVerdict.PASS
        if low >= 0.95
        else ProbeVerdict.FAIL
        if high < 0.95
        else ProbeVerdict.UNRESOLVED
    )
    figures = TargetFigures(good=int(o.good), total=int(o.total), low=low, high=high)
    return Probe(
        k=k, rate=rate, sent_rate=rate, verdict=verdict, requests=count, targets={"ttft": figures}
    )


def crossing_wilson(good: float, total: float) -> tuple[float, float]:
    from slotune.slo.attainment import wilson_interval  # noqa: PLC0415

    return wilson_interval(good, total)


def test_probes_go_to_the_fitted_crossing_until_its_interval_is_narrow() -> None:
    settings = SearchSettings(target_rate=2.0, min_rate=0.25, precision=capacity.FINE)
    truth = 3.37
    probes: list[Probe] = []
    while (k := capacity.next_index(settings, probes, {"ttft": P95})) is not None:
        probes.append(probe_at(settings, k, truth))
    found = capacity.capacity_of(settings, probes, {"ttft": P95})
    assert found.estimate is not None
    assert found.low is not None
    assert found.high is not None
    assert found.low < truth < found.high
    fitted = sum(
        capacity.fitting(settings, {p.k: p.verdict for p in probes[:i]}) for i in range(len(probes))
    )
    assert found.high / found.low <= settings.goal or fitted == settings.fitted
    assert 1 <= fitted <= settings.fitted
    # After the bracket, every probe lands within two coarse steps of the truth.
    bracketed = next(i for i, p in enumerate(probes) if p.verdict != ProbeVerdict.PASS)
    for p in probes[bracketed + 1 :]:
        assert abs(math.log(p.rate / truth)) < 2 * math.log(capacity.STEP)


def test_an_infeasible_screening_trial_keeps_its_coarse_bracket() -> None:
    """Screening spends no fitted probes on a configuration that failed the target."""
    settings = SearchSettings(target_rate=2.0, min_rate=0.25)
    truth = 1.1
    probes: list[Probe] = []
    while (k := capacity.next_index(settings, probes, {"ttft": P95})) is not None:
        probes.append(probe_at(settings, k, truth))
    assert len(probes) <= 3


def test_a_target_without_samples_says_nothing() -> None:
    """TPOT of one-token answers has no sample: it must not drag the capacity down."""
    ttft = [observe(r, 3.0) for r in (2.0, 2.8, 3.3, 4.0)]
    alone = crossing.fit({"ttft": (P95, ttft)})
    both = crossing.fit({"ttft": (P95, ttft), "tpot": (P95, [Observation(3.0, 0, 0, 0)])})
    assert alone is not None
    assert both is not None
    assert both.estimate == pytest.approx(alone.estimate)
    assert both.interval() == pytest.approx(alone.interval())


def test_an_open_interval_keeps_the_estimate_within_what_was_probed() -> None:
    passes = [Observation(r, 100, 100, 100) for r in (1.0, 1.6, 2.5)]
    fitted = crossing.fit({"ttft": (P95, passes)})
    assert fitted is not None
    assert fitted.estimate <= 2.5


def test_open_ends_leave_the_ratio_open_on_their_side() -> None:
    open_top = crossing.pool([(2.0, 1.9, None)], 0.0)
    closed = crossing.pool([(3.0, 2.9, 3.1)], 0.0)
    found = crossing.compare(open_top, closed)
    assert math.isinf(found.high)
    assert found.verdict == Difference.NONE  # "at least 2.0" cannot be called worse than 3.0
    nothing = crossing.pool([(0.6, 0.0, 0.9)], 0.0)  # passed at no rate probed
    better = crossing.compare(closed, nothing)
    assert math.isinf(better.high)
    assert better.verdict == Difference.BETTER
    assert "open]" in better.describe()


def test_disagreeing_starts_widen_the_pooled_interval() -> None:
    a, b = (2.8, 2.52, 3.11), (1.8, 1.63, 1.99)
    apart = crossing.pool([a, b], 0.05)
    assert not apart.agree
    low, high = apart.interval()
    assert high is not None
    assert low < 1.8  # Birge's ratio: as wide as the starts' own spread says
    assert high > 2.8 * 0.95


def test_a_resolved_failure_bounds_the_crossing_from_above() -> None:
    """Seen on the CPU engine (vLLM's defaults, ITL p95): attainment 98.3%, 96.8%, 95.7%,
    95.1%, 96.8% and then 92.6% at the highest rate, whose own interval lay below 95%. Without
    the failure's bound the fit left the interval open above; with it, the crossing lies at
    most a coarse step above the failure."""
    seen = [
        (1.448, 1188, 1209, 901.8),
        (1.878, 3509, 3626, 811.2),
        (1.933, 3469, 3626, 725.0),
        (1.990, 3448, 3627, 193.7),
        (2.170, 1170, 1209, 821.3),
    ]
    observed = [Observation(*row) for row in seen]
    failure = Observation(2.299, 3360, 3627, 390.7, failed=True)
    bounded = crossing.fit({"itl": (P95, [*observed, failure])})
    unbounded = crossing.fit({"itl": (P95, [*observed, replace(failure, failed=False)])})
    assert bounded is not None
    assert unbounded is not None
    _, high = bounded.interval()
    assert high is not None
    assert high <= 2.299 * capacity.STEP
    assert 2.0 < bounded.estimate < 2.3
    assert unbounded.interval()[1] is None or unbounded.interval()[1] > high


def test_a_resolved_pass_bounds_the_crossing_from_below() -> None:
    """Passes at 2.34 and 3.72 req/s and a failure beyond: the crossing cannot be fitted below
    the passes, however an outlying probe pulls."""
    seen = [
        Observation(2.34, 1201, 1209, 649.7, passed=True),
        Observation(3.72, 1206, 1209, 404.0, passed=True),
        Observation(4.82, 744, 774, 64.3),
        Observation(5.90, 397, 440, 28.6),
        Observation(3.83, 0, 9672, 3366.5),  # an outlier: every gap late, thousands of them
    ]
    fitted = crossing.fit({"itl": (P95, seen)})
    assert fitted is not None
    low, _ = fitted.interval()
    assert low >= 3.72 / capacity.STEP * 0.999


def test_a_power_law_curve_overloaded_far_above_does_not_pull_the_crossing_up() -> None:
    # Misses that grow as a power of the rate, 1 - A = 0.05 (r / c)^6, reach every request at
    # 1.65x the crossing; a logistic's approach that far more slowly. Probes at 0.9, 1.2 and
    # 2.0x, 400 samples each: fitted with the logistic alone the far probe steepens the upper
    # slope and puts the crossing at 1.15, its interval 1.085-1.19, short of the truth.
    def power(rate: float) -> float:
        return max(0.0, 1 - 0.05 * rate**6)

    observations = [Observation(r, round(power(r) * 400), 400, 400) for r in (0.9, 1.2, 2.0)]
    found = crossing.fit({"ttft": (P95, observations)})
    assert found is not None
    low, high = found.interval()
    assert high is not None
    assert low <= 1.0 <= high
    assert found.estimate < 1.1


def test_the_likelihoods_temper_is_students_at_the_batch_means_degrees() -> None:
    assert crossing.BATCH_DEGREES == attainment.BATCHES - 1
    assert crossing.TEMPER < 1


def test_a_failed_window_past_the_capacity_bounds_the_queued_curve_from_above_only() -> None:
    # `make tune` run 29, trial #3 (bench/results/make-tune-29/trials.jsonl): every TTFT within
    # the bound at 2.33 and 3.70 req/s; the queue rose at 3.92 (no steady state: no sample in
    # time); windows stopped early at 4.80 and 5.88 had 34% and 52% of TTFTs in time, seen
    # before their queues had made every request late. Read as the curve's values they
    # contradict the 3.92 probe, and the fit put the capacity at 3.35 [3.30, 3.53], below the
    # rate that passed; read as upper bounds of the steady state, it lies between 3.70 and 3.92.
    def probe(rate: float, verdict: str, ttft: tuple[int, int, float, float, float],
              itl: tuple[int, int, float, float, float]) -> Probe:  # fmt: skip
        def figures(t: tuple[int, int, float, float, float]) -> TargetFigures:
            good, total, effective, low, high = t
            return TargetFigures(good=good, total=total, effective=effective, low=low, high=high)

        return Probe(
            k=0,
            rate=rate,
            sent_rate=rate,
            verdict=ProbeVerdict(verdict),
            requests=ttft[1],
            targets={"ttft": figures(ttft), "itl": figures(itl)},
        )

    probes = [
        probe(2.33, "Pass", (39, 39, 39.0, 0.91, 1.0), (1201, 1209, 564.8, 0.983, 0.998)),
        probe(3.70, "Pass", (39, 39, 39.0, 0.91, 1.0), (1199, 1209, 615.0, 0.981, 0.996)),
        probe(5.88, "Fail", (31, 59, 9.4, 0.249, 0.787), (1160, 1199, 196.0, 0.932, 0.985)),
        probe(4.80, "Fail", (26, 76, 10.6, 0.136, 0.632), (1300, 1336, 106.9, 0.922, 0.991)),
        probe(3.92, "Unstable", (215, 258, 28.1, 0.658, 0.929), (7945, 7998, 666.8, 0.984, 0.997)),
    ]
    found = capacity.fit_probes(probes, {"ttft": 90.0, "itl": 95.0})
    assert found is not None
    low, high = found.interval()
    assert high is not None
    assert 3.70 <= found.estimate <= 3.92
    assert low >= 3.3
    assert high <= 3.92 * 1.13
