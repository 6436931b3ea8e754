"""SLO verdicts from per-request samples and from Prometheus histograms, and the
--custom-histogram-buckets value that makes histograms able to decide."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from slotune.engine.vllm import DEFAULT_BUCKETS, custom_histogram_buckets, histogram_bounds
from slotune.metrics import Exposition
from slotune.models import SloSpec, SloTarget
from slotune.slo.histogram import evaluate_samples, histogram_quantile, judge_histogram

REAL_EXPOSITION = Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt"
INF = math.inf


def cumulative(bounds: list[float], values: list[float]) -> list[tuple[float, float]]:
    """Buckets as Prometheus keeps them, from raw observations."""
    return [(b, float(sum(v <= b for v in values))) for b in [*bounds, INF]]


# --- per-request samples ------------------------------------------------------------------


def test_samples_meet_and_violate_targets_by_the_exact_percentile() -> None:
    slo = SloSpec(
        ttft=SloTarget(percentile=95, max_seconds=2.0),
        tpot=SloTarget(percentile=50, max_seconds=0.05),
    )
    ttft = [0.1 * i for i in range(1, 21)]  # 0.1 .. 2.0; p95 = 1.905
    result = evaluate_samples(slo, {"ttft": ttft, "tpot": [0.04, 0.05, 0.06]})
    assert result.targets["ttft"].observed_seconds == pytest.approx(1.905)
    assert result.targets["ttft"].met is True
    assert result.targets["tpot"].observed_seconds == pytest.approx(0.05)
    assert result.targets["tpot"].met is True  # at the bound counts as met
    assert result.met is True

    slower = evaluate_samples(slo, {"ttft": [*ttft, 5.0, 6.0], "tpot": [0.04, 0.05, 0.06]})
    assert slower.targets["ttft"].met is False
    assert slower.met is False
    assert "p95 ttft <= 2s: violated" in slower.describe()


def test_a_target_without_samples_leaves_the_verdict_open_unless_another_fails() -> None:
    slo = SloSpec(ttft=SloTarget(percentile=95, max_seconds=1.0), e2e=SloTarget(max_seconds=10.0))
    open_ = evaluate_samples(slo, {"ttft": [0.5]})
    assert open_.targets["e2e"].met is None
    assert open_.targets["e2e"].samples == 0
    assert open_.met is None
    assert evaluate_samples(slo, {"ttft": [3.0]}).met is False
    assert set(open_.targets) == {"ttft", "e2e"}  # only the targets that are set


# --- histogram_quantile -------------------------------------------------------------------


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.5, 10.0), (1.0, 50.0), (2.5, 90.0), (INF, 100.0)]
    assert histogram_quantile(50, buckets) == pytest.approx(1.0)
    # rank 20 lies in (0.5, 1.0]: 0.5 + 0.5 * 10/40
    assert histogram_quantile(20, buckets) == pytest.approx(0.625)
    # first bucket starts at 0
    assert histogram_quantile(5, buckets) == pytest.approx(0.25)
    # rank in +Inf bucket: the largest finite bound
    assert histogram_quantile(95, buckets) == 2.5
    assert math.isnan(histogram_quantile(95, [(1.0, 0.0), (INF, 0.0)]))
    assert math.isnan(histogram_quantile(95, [(1.0, 3.0), (2.0, 4.0)]))  # no +Inf


# --- judging pN <= threshold from a histogram -----------------------------------------------


def test_threshold_on_a_bound_is_decided_exactly() -> None:
    # 95 of 100 at or below 1.0 s: p95 <= 1.0 holds; 94 of 100 it does not.
    met = judge_histogram([(0.5, 50.0), (1.0, 95.0), (2.5, 100.0), (INF, 100.0)], 95, 1.0)
    assert (met.met, met.resolvable) == (True, True)
    assert "95 of 100" in met.reason
    missed = judge_histogram([(0.5, 50.0), (1.0, 94.0), (2.5, 100.0), (INF, 100.0)], 95, 1.0)
    assert (missed.met, missed.resolvable) == (False, True)
    assert missed.estimate is not None
    assert missed.estimate > 1.0


def test_threshold_between_bounds_is_unresolvable_unless_the_neighbours_settle_it() -> None:
    ttft_bounds = list(DEFAULT_BUCKETS["time_to_first_token"])  # ... 1.0, 2.5 ...
    # 90 % under 1.0 s, the rest at 1.5-2.4 s: p95 is somewhere in (1.0, 2.5]
    values = [0.5] * 90 + [1.5, 1.7, 1.9, 2.1, 2.3, 2.4, 2.4, 2.4, 2.4, 2.4]
    verdict = judge_histogram(cumulative(ttft_bounds, values), 95, 2.0)
    assert verdict.met is None
    assert verdict.resolvable is False
    assert "between the bucket bounds 1s and 2.5s" in verdict.reason
    assert verdict.estimate is not None
    assert 1.0 < verdict.estimate <= 2.5

    # Already 96 % under 1.0 s: p95 <= 2.0 whatever lies above.
    fast = judge_histogram(cumulative(ttft_bounds, [0.5] * 96 + [2.4] * 4), 95, 2.0)
    assert (fast.met, fast.resolvable) == (True, True)
    # Only 90 % under 2.5 s: p95 > 2.5 > 2.0.
    slow = judge_histogram(cumulative(ttft_bounds, [0.5] * 90 + [3.0] * 10), 95, 2.0)
    assert (slow.met, slow.resolvable) == (False, True)


def test_empty_or_malformed_histograms_decide_nothing() -> None:
    empty = judge_histogram([(1.0, 0.0), (INF, 0.0)], 95, 1.0)
    assert empty.met is None
    assert "no observations" in empty.reason
    no_inf = judge_histogram([(1.0, 3.0)], 95, 1.0)
    assert (no_inf.met, no_inf.resolvable) == (None, False)


def test_histogram_verdicts_agree_with_the_samples_they_came_from() -> None:
    """Where the histogram decides, it decides as the exact percentile does."""
    rng = random.Random(7)  # noqa: S311 - reproducible test data
    bounds = histogram_bounds(SloSpec(ttft=SloTarget(percentile=95, max_seconds=2.0)))
    ttft_bounds = bounds["time_to_first_token"]
    decided = 0
    for _ in range(200):
        values = [rng.lognormvariate(0, 0.6) for _ in range(rng.randint(1, 60))]
        for threshold in [1.0, 2.0, 1.7, 0.3]:
            verdict = judge_histogram(cumulative(ttft_bounds, values), 95, threshold)
            truth = sum(v <= threshold for v in values) >= 0.95 * len(values)
            if verdict.met is not None:
                decided += 1
                assert verdict.met == truth
            else:
                assert threshold not in ttft_bounds
    assert decided > 400


def test_the_real_exposition_decides_a_ttft_slo_at_a_default_bound() -> None:
    real = Exposition.parse(REAL_EXPOSITION.read_text())
    buckets = real.histogram_buckets("vllm:time_to_first_token_seconds")
    assert judge_histogram(buckets, 95, 0.1).met is True  # the one request took 0.041 s
    assert judge_histogram(buckets, 95, 0.04).met is False
    # 0.05 s sits between 0.04 and 0.06: not decidable
    assert judge_histogram(buckets, 95, 0.05).resolvable is False


# --- --custom-histogram-buckets -------------------------------------------------------------


def test_custom_buckets_add_bounds_around_each_threshold_to_the_defaults() -> None:
    slo = SloSpec(
        ttft=SloTarget(percentile=95, max_seconds=2.0),
        tpot=SloTarget(percentile=90, max_seconds=0.04),
        itl=SloTarget(percentile=99, max_seconds=0.1),
    )
    parsed = json.loads(custom_histogram_buckets(slo))
    assert set(parsed) == {"time_to_first_token", "inter_token_latency"}  # no e2e target
    ttft = parsed["time_to_first_token"]
    assert set(DEFAULT_BUCKETS["time_to_first_token"]) <= set(ttft)
    assert {1.6, 1.8, 2.0, 2.2} <= set(ttft)  # 2.5 is a default already
    itl = parsed["inter_token_latency"]
    assert {0.032, 0.036, 0.04, 0.044, 0.05, 0.08, 0.09, 0.1, 0.11, 0.125} <= set(itl)
    assert set(DEFAULT_BUCKETS["inter_token_latency"]) <= set(itl)
    for bounds in parsed.values():  # what vLLM's validator requires
        assert all(b > 0 and math.isfinite(b) for b in bounds)
        assert all(a < b for a, b in itertools.pairwise(bounds))


def test_custom_buckets_make_the_threshold_decidable() -> None:
    slo = SloSpec(ttft=SloTarget(percentile=95, max_seconds=2.0))
    values = [0.5] * 90 + [1.5, 1.7, 1.9, 2.1, 2.3, 2.4, 2.4, 2.4, 2.4, 2.4]
    default = judge_histogram(
        cumulative(list(DEFAULT_BUCKETS["time_to_first_token"]), values), 95, 2.0
    )
    custom = judge_histogram(
        cumulative(histogram_bounds(slo)["time_to_first_token"], values), 95, 2.0
    )
    assert default.met is None
    assert custom.met is False  # 93 of 100 at or below 2.0 s


def test_e2e_threshold_goes_to_request_latency_and_odd_values_round_cleanly() -> None:
    slo = SloSpec(e2e=SloTarget(max_seconds=0.3))
    bounds = histogram_bounds(slo)
    assert set(bounds) == {"request_latency"}
    assert {0.24, 0.27, 0.3, 0.33, 0.375} <= set(bounds["request_latency"])
    assert len(bounds["request_latency"]) == len(set(bounds["request_latency"]))


def test_with_a_confidence_the_histogram_is_judged_by_the_attainment_interval() -> None:
    """Live judgement takes the window as a sample: 95 of 100 within the bound is exactly
    the target, so undecided; 990 of 1000 decides it, and 900 of 1000 decides against it."""

    def buckets(good: int, total: int) -> list[tuple[float, float]]:
        return [(1.0, float(good)), (2.5, float(total)), (INF, float(total))]

    assert judge_histogram(buckets(95, 100), 95, 1.0).met is True  # the observations' p95
    open_ = judge_histogram(buckets(95, 100), 95, 1.0, confidence=0.95)
    assert (open_.met, open_.resolvable) == (None, True)
    assert "interval" in open_.reason
    assert judge_histogram(buckets(990, 1000), 95, 1.0, confidence=0.95).met is True
    assert judge_histogram(buckets(900, 1000), 95, 1.0, confidence=0.95).met is False
