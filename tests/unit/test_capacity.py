"""The decision core of a trial: attainment intervals, probe verdicts, the steadiness check,
the schedule's common random numbers, and the bracket-then-bisect search on a scripted
engine."""

from __future__ import annotations

import math
import random

import pytest

from slotune.measure import capacity
from slotune.measure.capacity import (
    Capacity,
    Probe,
    ProbeVerdict,
    QueueSample,
    SearchSettings,
    TargetFigures,
    bracket,
    capacity_of,
    next_probe,
    overlaps,
    probe_decision,
    scaled_arrivals,
    stationarity,
)
from slotune.models import SloSpec, SloTarget
from slotune.slo.attainment import (
    Attainment,
    Verdict,
    effective_samples,
    judge,
    judge_requests,
    requests_to_resolve,
    tally,
    wilson_interval,
    z_value,
)
from support.outcomes import Result

# --- the interval -------------------------------------------------------------------------------


def test_wilson_matches_the_textbook_values() -> None:
    # Wilson (1927) / Newcombe (1998) example: 81 of 263 at 95%.
    low, high = wilson_interval(81, 263)
    assert low == pytest.approx(0.2553, abs=5e-4)
    assert high == pytest.approx(0.3662, abs=5e-4)
    assert z_value(0.95) == pytest.approx(1.959964, abs=1e-6)


def test_wilson_at_the_edges_stays_inside_zero_and_one() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(20, 20)
    assert high == 1.0
    assert low == pytest.approx(20 / (20 + z_value(0.95) ** 2))
    low, high = wilson_interval(0, 20)
    assert low == 0.0  # exactly: a table prints it
    assert 0 < high < 0.2
    with pytest.raises(ValueError, match="good <= total"):
        wilson_interval(3, 2)


def test_the_interval_covers_the_true_attainment_about_as_often_as_it_claims() -> None:
    rng = random.Random(5)  # noqa: S311 - reproducible test data
    p, n, runs = 0.95, 120, 2000
    covered = 0
    for _ in range(runs):
        good = sum(rng.random() < p for _ in range(n))
        low, high = wilson_interval(good, n)
        covered += low <= p <= high
    # Binomial standard error of a 95% rate over 2000 runs is 0.5%: 4 of them either side.
    assert 0.93 <= covered / runs <= 0.97


def test_a_perfect_run_resolves_only_with_enough_requests() -> None:
    z = z_value(0.95)
    needed = requests_to_resolve(95, z)
    assert needed == 73
    slo_target = 0.95
    assert wilson_interval(needed, needed)[0] >= slo_target
    assert wilson_interval(needed - 1, needed - 1)[0] < slo_target


def attainment(good: int, total: int, percentile: float = 95) -> Attainment:
    low, high = wilson_interval(good, total)
    return Attainment("ttft", percentile, 2.0, good, total, low, high)


def test_verdicts_are_given_only_when_the_interval_is_on_one_side() -> None:
    assert attainment(100, 100).verdict == Verdict.PASS
    assert attainment(80, 100).verdict == Verdict.FAIL
    assert attainment(95, 100).verdict == Verdict.UNRESOLVED  # exactly p95: open
    assert attainment(40, 40).verdict == Verdict.UNRESOLVED  # too few to tell
    assert attainment(0, 0).verdict == Verdict.UNRESOLVED


# --- one definition per SLO metric ----------------------------------------------------------------


def test_failed_requests_count_against_every_metric() -> None:
    results = [
        Result(ttft=0.5, e2e=0.9, itls=[0.1] * 4),
        Result(ttft=None, e2e=30.0, error="timeout"),
    ]
    assert tally("ttft", results, 1.0) == (1, 2)
    assert tally("tpot", results, 1.0) == (1, 2)
    assert tally("e2e", results, 1.0) == (1, 2)
    # ITL is judged per gap, as vLLM's histogram counts it: 4 good gaps, 1 failed request.
    assert tally("itl", results, 0.2) == (4, 5)


def test_itl_is_every_gap_not_each_requests_largest() -> None:
    # One slow gap in each of 10 requests of 20 gaps: 5% of gaps over the bound, though
    # every request's largest gap is.
    results = [Result(ttft=0.1, e2e=3.0, itls=[0.05] * 19 + [0.5], output_tokens=21)] * 10
    good, total = tally("itl", results, 0.1)
    assert (good, total) == (190, 200)
    slo = SloSpec.model_validate({"itl": {"percentile": 90, "maxSeconds": 0.1}})
    assert judge_requests(slo, results)["itl"].verdict == Verdict.PASS


# --- a probe's verdict and steadiness -------------------------------------------------------------


def test_a_rising_queue_is_not_steady_and_a_noisy_flat_one_is() -> None:
    rising = [QueueSample(t, waiting=t * 0.8, kv_usage=0.3) for t in range(30)]
    assert not stationarity(rising, 0, 29).stationary
    rng = random.Random(1)  # noqa: S311 - reproducible test data
    flat = [QueueSample(t, waiting=rng.choice([0, 1, 2, 3, 4])) for t in range(30)]
    assert stationarity(flat, 0, 29).stationary
    climbing_kv = [QueueSample(t, waiting=0, kv_usage=0.2 + t / 40) for t in range(30)]
    steady = stationarity(climbing_kv, 0, 29)
    assert not steady.stationary
    assert "KV" in steady.reason
    assert stationarity([QueueSample(0, 5)], 0, 10).stationary  # too few scrapes: not judged


def test_an_open_or_unsteady_probe_is_extended_then_reported_as_such() -> None:
    steady = capacity.Stationarity(True, "steady")
    rising = capacity.Stationarity(False, "rising")
    passing = {"ttft": attainment(100, 100)}
    open_ = {"ttft": attainment(95, 100)}
    failing = {"ttft": attainment(50, 100)}
    assert probe_decision(passing, steady, can_extend=True) == ProbeVerdict.PASS
    assert probe_decision(failing, rising, can_extend=True) == ProbeVerdict.FAIL
    assert probe_decision(open_, steady, can_extend=True) is None
    assert probe_decision(open_, steady, can_extend=False) == ProbeVerdict.UNRESOLVED
    assert probe_decision(passing, rising, can_extend=True) is None
    assert probe_decision(passing, rising, can_extend=False) == ProbeVerdict.UNSTABLE


# --- common random numbers ------------------------------------------------------------------------


def test_every_segment_of_a_schedule_sends_at_exactly_its_rate() -> None:
    times = scaled_arrivals(7, 4.0, [10, 80, 80])
    assert len(times) == 170
    assert times == sorted(times)
    # Segment starts: each m-request segment spans m / rate seconds.
    assert times[10] == pytest.approx(10 / 4.0)
    assert times[90] == pytest.approx(90 / 4.0)
    assert scaled_arrivals(7, 4.0, [10, 80, 80]) == times  # same seed, same arrivals
    assert scaled_arrivals(8, 4.0, [10, 80, 80]) != times


def test_the_schedule_of_a_rate_is_shared_by_every_configuration_of_a_study() -> None:
    assert capacity.schedule_seed(1, 3) == capacity.schedule_seed(1, 3)
    assert capacity.schedule_seed(1, 3) != capacity.schedule_seed(2, 3)  # a re-measure
    assert capacity.schedule_seed(1, 3) != capacity.schedule_seed(1, 4)


# --- the search on a scripted engine --------------------------------------------------------------


def search(settings: SearchSettings, true_capacity: float, noise: float = 0.0) -> Capacity:
    """The search against an engine that passes every rate at or below its capacity."""
    rng = random.Random(3)  # noqa: S311 - reproducible test data
    probes: list[Probe] = []
    while (k := next_probe(settings, {p.k: p.verdict for p in probes})) is not None:
        rate = settings.rate(k)
        seen = true_capacity * (1 + rng.uniform(-noise, noise))
        verdict = ProbeVerdict.PASS if rate <= seen else ProbeVerdict.FAIL
        probes.append(Probe(k=k, rate=rate, sent_rate=rate, verdict=verdict, requests=80))
    return capacity_of(settings, probes)


@pytest.mark.parametrize("true_capacity", [2.3, 3.0, 4.4, 7.9, 15.0])
def test_a_feasible_engine_is_bracketed_to_one_step(true_capacity: float) -> None:
    settings = SearchSettings(target_rate=2.0, min_rate=0.25)
    found = search(settings, true_capacity)
    assert found.feasible
    assert found.upper is not None
    assert found.capacity <= true_capacity < found.upper
    assert found.upper / found.capacity == pytest.approx(capacity.STEP)  # one coarse step
    assert len(found.probes) <= settings.max_probes
    assert found.stopped == "bracketed"


def test_an_infeasible_engine_stops_at_a_coarse_bracket() -> None:
    settings = SearchSettings(target_rate=2.0, min_rate=0.25)
    found = search(settings, 1.1)
    assert not found.feasible
    assert found.capacity <= 1.1 < (found.upper or math.inf)
    assert len(found.probes) <= 3  # the target, a jump down, at most one more


def test_the_baseline_is_bracketed_finely_even_when_infeasible() -> None:
    settings = SearchSettings(target_rate=2.0, min_rate=0.25, infeasible_precision=capacity.FINE)
    found = search(settings, 1.1)
    assert found.upper is not None
    assert found.upper / found.capacity == pytest.approx(capacity.STEP)


def test_no_probe_is_sent_above_the_ceiling_or_below_the_floor() -> None:
    capped = SearchSettings(target_rate=2.0, max_rate=5.0)
    found = search(capped, 100.0)
    assert all(p.rate <= 5.0 for p in found.probes)
    assert found.upper is None
    assert "ceiling" in found.stopped
    floored = SearchSettings(target_rate=2.0, min_rate=0.5)
    nothing = search(floored, 0.1)
    assert nothing.capacity == 0.0
    assert all(p.rate >= 0.5 - 1e-9 for p in nothing.probes)


def test_unresolved_and_unstable_probes_never_count_as_a_pass() -> None:
    outcomes = {0: ProbeVerdict.PASS, 4: ProbeVerdict.UNRESOLVED, 2: ProbeVerdict.UNSTABLE}
    assert bracket(outcomes) == capacity.Bracket(passed=0, blocked=2)
    # A pass above a failure (noise at the boundary) does not raise the capacity.
    noisy = {0: ProbeVerdict.PASS, 2: ProbeVerdict.FAIL, 3: ProbeVerdict.PASS}
    assert bracket(noisy) == capacity.Bracket(passed=0, blocked=2)


def test_the_probe_budget_ends_a_search_and_says_so() -> None:
    settings = SearchSettings(target_rate=2.0, max_probes=2)
    found = search(settings, 3.1)
    assert len(found.probes) == 2
    assert "budget" in found.stopped


def test_overlapping_intervals() -> None:
    def cap(low: float, high: float | None) -> Capacity:
        return Capacity(capacity=low, upper=high, target_rate=1, feasible=True, stopped="-")

    w = capacity.STEP**capacity.RESTART_SPREAD
    assert cap(4, 4.5).interval == pytest.approx((4 / w, 4.5 * w))
    assert cap(4, None).interval == (pytest.approx(4 / w), None)
    # Brackets one step apart share rates once the run-to-run spread widens them ...
    assert overlaps(cap(1, 2), cap(2, 3))
    assert overlaps(cap(1, None), cap(5, 6))
    # ... brackets further apart than the spread do not.
    assert not overlaps(cap(1, 1.2), cap(1.2 * w * w, 2))
    assert capacity.above(cap(1.2 * w * w, 2), cap(1, 1.2)) == pytest.approx(1.0)  # touching
    assert capacity.above(cap(2 * w * w, 3), cap(1, 1.2)) == pytest.approx(2 / 1.2)
    assert capacity.above(cap(1, 1.2), cap(2, 3)) is None
    assert capacity.above(cap(5, 6), cap(1, None)) is None


def test_equal_capacities_rank_by_how_near_each_came_to_the_next_rate() -> None:
    # The H200 study's screening: four infeasible configurations passed 11.1 req/s and failed
    # 17.6; one failed on TTFT alone with half its requests in time, the others lost TPOT
    # outright. The one that nearly passed is the one worth re-measuring.
    def failed_at_upper(good: int, total: int) -> Capacity:
        at_upper = Probe(
            k=0,
            rate=17.6,
            sent_rate=17.6,
            verdict=ProbeVerdict.FAIL,
            requests=total,
            targets={
                "ttft": TargetFigures(good=good, total=total, low=0, high=1),
                "tpot": TargetFigures(good=total, total=total, low=0.9, high=1),
            },
        )
        passed = Probe(k=-4, rate=11.1, sent_rate=11.1, verdict=ProbeVerdict.PASS, requests=500)
        return Capacity(
            capacity=11.1,
            upper=17.6,
            target_rate=17.6,
            feasible=False,
            stopped="bracketed",
            probes=[at_upper, passed],
        )

    assert capacity.attainment_at_upper(failed_at_upper(274, 528)) == pytest.approx(274 / 528)
    assert capacity.attainment_at_upper(failed_at_upper(0, 264)) == 0.0
    # Every probe passed: nothing was missed. A compact record without figures: no claim.
    unbounded = Capacity(capacity=20, target_rate=17.6, feasible=True, stopped="-")
    assert capacity.attainment_at_upper(unbounded) == 1.0
    bare = failed_at_upper(274, 528)
    slim = bare.model_copy(
        update={"probes": [p.model_copy(update={"targets": {}}) for p in bare.probes]}
    )
    assert capacity.attainment_at_upper(slim) == 0.0


def test_a_capacity_describes_its_interval_and_its_bracket() -> None:
    found = Capacity(capacity=4.01, upper=4.5, target_rate=7.15, feasible=False, stopped="-")
    assert capacity.RESTART_SPREAD == 2  # two grid steps each side: x/÷ 2 ** (1/3)
    assert found.describe() == "4.01 req/s [3.18, 5.67] (bracket [4.01, 4.5))"
    # With a fit, the estimate and its interval (this start's, widened by the spread).
    fitted = capacity.with_fit(found.model_copy(update={"spread": 0.05}), 4.2, 4.0, 4.4)
    low, high = fitted.interval
    assert low < 4.0
    assert high is not None
    assert high > 4.4
    assert fitted.describe().startswith("4.2 req/s [")
    assert fitted.at_target == capacity.AtTarget.INFEASIBLE
    assert not fitted.feasible


def test_one_definition_per_slo_metric_everywhere() -> None:
    """The attainment registry, the API's targets and vLLM's custom-bucket families name the
    same metrics the same way, and each engine adapter names a histogram with default bounds
    for each SLO metric it observes: forgetting one place fails here."""
    from slotune.engine import ENGINES  # noqa: PLC0415
    from slotune.engine.vllm import TARGET_FAMILY  # noqa: PLC0415
    from slotune.slo.attainment import SLO_METRICS  # noqa: PLC0415

    api = set(SloSpec.model_fields) - {"window"}
    assert set(SLO_METRICS) == api == set(TARGET_FAMILY)
    assert set(ENGINES["vllm"].metrics) >= set(SLO_METRICS)
    for engine in ENGINES.values():
        observed = set(SLO_METRICS) & set(engine.metrics)
        assert observed == set(engine.default_buckets), engine.kind


# --- correlated samples: batch means ------------------------------------------------------------


def test_independent_requests_keep_about_their_raw_count() -> None:
    # 1000 independent requests at 90%: the batch estimate of the design effect is a chi-square
    # of 9 degrees of freedom over 9 (for independent samples), above 3 with probability 0.1%.
    rng = random.Random(7)  # noqa: S311 - a reproducible draw, not a secret
    counts = [(1, 1) if rng.random() < 0.9 else (0, 1) for _ in range(1000)]
    assert 1000 / 3 <= effective_samples(counts) <= 1000


def test_a_failure_episode_counts_for_few_samples() -> None:
    # 80 good requests, then a queue episode that fails the last 20: the batches disagree, so
    # the run is worth about 9 independent requests over 10 batches (design effect 11.1, worked
    # by hand), and fewer over the 6 longer batches slotune uses.
    counts = [(1, 1)] * 80 + [(0, 1)] * 20
    by_ten = effective_samples(counts, batches=10)
    assert by_ten == pytest.approx(100 / (10 / 9 * 160 / 10_000 / 0.0016))
    assert effective_samples(counts) < by_ten
    slo = SloTarget(percentile=90, max_seconds=2.0)
    raw = judge("ttft", slo, 80, 100)
    assert raw.verdict == Verdict.FAIL  # as if independent: 80% is surely below 90%
    honest = judge("ttft", slo, 80, 100, effective=effective_samples(counts))
    assert honest.verdict == Verdict.UNRESOLVED  # one episode cannot tell
    assert honest.low < raw.low
    assert honest.high > raw.high
    assert "worth 6 independent" in honest.describe()


def test_gaps_of_one_stalled_request_are_one_event() -> None:
    # ITL: 20 requests of 50 gaps; one request stalls on every gap. 95% of gaps are good, but
    # they are one request's worth of evidence, not 50 independent bad gaps.
    counts = [(50, 50)] * 19 + [(0, 50)]
    raw = 1000
    assert effective_samples(counts) < raw / 10
    # Spread evenly (each request 2.5 bad gaps on average), the gaps are nearly independent.
    even = [(47, 50), (48, 50)] * 10
    assert effective_samples(even) == raw  # batches agree exactly: no design effect


def test_agreeing_or_tiny_runs_keep_their_raw_count() -> None:
    assert effective_samples([(1, 1)] * 30) == 30
    assert effective_samples([(0, 1)] * 30) == 30
    assert effective_samples([(3, 4)]) == 4  # one batch: no spread to measure
    assert effective_samples([]) == 0
    assert effective_samples([(0, 0), (1, 1), (1, 1)]) == 2  # requests without samples skipped


def test_a_compact_record_of_a_search_that_never_failed_reads_back() -> None:
    """The load Job's termination message drops empty fields; a capacity with no failed rate
    (every probe passed, up to the ceiling) must still read back (the operator parses it)."""
    from slotune.measure.probe import compact  # noqa: PLC0415 - loads the load generator
    from slotune.measure.record import Measurement  # noqa: PLC0415

    found = Capacity(
        capacity=4.0, upper=None, target_rate=2.0, feasible=True, stopped="passed at the top"
    )
    text = compact(Measurement(capacity=found))
    assert '"upper"' not in text
    again = Measurement.model_validate_json(text)
    assert again.capacity == found


def test_preemptions_over_the_window_are_not_steady_state() -> None:
    """A KV cache that ran full preempts requests: the probe says so and is not steady."""
    calm = [capacity.QueueSample(t, 2.0, 0.5, 10.0) for t in range(10)]
    steady = capacity.stationarity(calm, 0, 9)
    assert steady.stationary
    assert steady.preempted == 0
    assert steady.kv_peak == 0.5
    full = [capacity.QueueSample(t, 2.0, 0.99, 10.0 + t) for t in range(10)]
    found = capacity.stationarity(full, 0, 9)
    assert not found.stationary
    assert found.preempted == 9
    assert "preempted 9 requests" in found.reason


def test_an_unsteady_probe_counts_as_past_the_capacity_for_what_a_queue_delays() -> None:
    """A growing queue makes first tokens late, not the gaps of running streams: seen on the
    CPU engine, an unstable probe's ITL attainment of 99.4% (3,366 effective gaps) taken as 0
    put the fitted capacity below two rates that had passed."""
    ttft = TargetFigures(good=271, total=312, low=0.58, high=0.97, effective=11.4)
    itl = TargetFigures(good=9640, total=9672, low=0.994, high=0.998, effective=3366.5)
    probe = Probe(
        k=0, rate=3.83, sent_rate=3.83, verdict=ProbeVerdict.UNSTABLE, requests=312,
        targets={"ttft": ttft, "itl": itl},
    )  # fmt: skip
    (late,) = capacity.observations([probe], "ttft", 90)
    assert late.good == 0
    assert late.failed
    (gaps,) = capacity.observations([probe], "itl", 95)
    assert gaps.good == 9640
    assert gaps.passed
