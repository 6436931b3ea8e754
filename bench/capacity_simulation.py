"""The capacity estimator against a synthetic engine whose capacity is known.

Each search runs slotune's own rate search (`capacity.next_probe`, the probe verdicts of
`capacity.probe_decision` over `attainment`'s Wilson intervals on effective samples, windows
extended while unresolved) against a simulated engine, then states the capacity two ways from
the same probes:

- **bracket** (slotune up to this change): the highest rate that passed, its interval the
  bracket widened by `RESTART_SPREAD` grid steps each side;
- **fit** (`slotune.measure.crossing`): the crossing of the fitted attainment curves, its
  interval the fit's, widened by the between-start spread.

The synthetic engine: two per-request targets (p90 and p95), each with its own crossing, the
second 1-1.5x the first. Attainment against rate follows one of three shapes (logistic in log
rate, a power law in the violation rate, a hard knee), so the fit's own form is not the truth.
Requests are not independent: a two-state Markov chain (bursts of mean length 8 requests,
15% of the time) multiplies the violation probability by 4 inside a burst (less outside, so
the mean is the curve's). Each search is a fresh engine start: its capacity is the
configuration's times a log-normal factor (sigma `--spread`), and the fit's interval is
widened by that sigma, as a study widens it by the platform's measured spread.

Coverage is the share of searches whose stated 95% interval holds the configuration's true
capacity; the error is |stated / true - 1|. Run: `python bench/capacity_simulation.py`
(1,000 searches, about a minute).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from slotune.measure.capacity import (
    FITTED,
    GOAL,
    MAX_PROBES,
    STEP,
    Probe,
    SearchSettings,
    Stationarity,
    TargetFigures,
    capacity_of,
    next_index,
    next_probe,
    probe_decision,
)
from slotune.models import SloTarget
from slotune.slo import attainment

PERCENTILES = {"ttft": 90.0, "itl": 95.0}
STEADY = Stationarity(True, "simulated")


def _shape(kind: str, steep: float) -> Callable[[float, float], float]:
    """Attainment at rate r for a target whose crossing is c and percentile q."""

    def logistic(r: float, c: float, q: float) -> float:
        z = math.log(q / (1 - q)) - steep * math.log(r / c)
        return 1 / (1 + math.exp(-z))

    def power(r: float, c: float, q: float) -> float:
        return max(0.0, 1 - (1 - q) * (r / c) ** steep)

    def knee(r: float, c: float, q: float) -> float:
        # Flat near the percentile's neighbourhood below the knee, falling fast past it.
        if r <= c:
            return 1 - (1 - q) * (r / c) ** 2
        return max(0.0, q - (r / c - 1) * steep * 0.5)

    return {"logistic": logistic, "power": power, "knee": knee}[kind]


@dataclass
class Engine:
    """One engine start: the crossings of both targets and the curve's shape."""

    crossings: dict[str, float]
    curve: Callable[[float, float, float], float]
    rng: random.Random
    burst_share: float = 0.15
    burst_length: float = 8.0
    burst_factor: float = 4.0

    def requests(self, rate: float, count: int) -> dict[str, list[tuple[int, int]]]:
        """(good, total) per request, in arrival order, for each target."""
        stay = 1 - 1 / self.burst_length
        enter = self.burst_share / (1 - self.burst_share) / self.burst_length
        misses = {}
        for name, q in PERCENTILES.items():
            miss = 1 - self.curve(rate, self.crossings[name], q / 100)
            # Inside a burst `burst_factor` times the mean, at most every request; outside,
            # what keeps the mean the curve's (once bursts miss every request, the calm
            # stretches carry the rest).
            inside = min(1.0, miss * self.burst_factor)
            outside = (miss - self.burst_share * inside) / (1 - self.burst_share)
            misses[name] = (inside, outside)
        out: dict[str, list[tuple[int, int]]] = {name: [] for name in PERCENTILES}
        burst = self.rng.random() < self.burst_share
        for _ in range(count):
            burst = self.rng.random() < (stay if burst else enter)
            for name in PERCENTILES:
                inside, outside = misses[name]
                good = self.rng.random() >= (inside if burst else outside)
                out[name].append((int(good), 1))
        return out


def probe(engine: Engine, k: int, rate: float, window: int, extensions: int = 2) -> Probe:
    """One probe as `tuner.measure` runs it: the window, extended while the verdict is open."""
    counts: dict[str, list[tuple[int, int]]] = {name: [] for name in PERCENTILES}
    extended = 0
    while True:
        more = engine.requests(rate, window)
        for name in counts:
            counts[name] += more[name]
        judged = {
            name: attainment.judge(
                name,
                SloTarget(percentile=q, max_seconds=1.0),
                sum(g for g, _ in counts[name]),
                len(counts[name]),
                effective=attainment.effective_samples(counts[name]),
            )
            for name, q in PERCENTILES.items()
        }
        verdict = probe_decision(judged, STEADY, can_extend=extended < extensions)
        if verdict is not None:
            break
        extended += 1
    figures = {
        name: TargetFigures(
            good=a.good, total=a.total, low=a.low, high=a.high, effective=a.effective
        )
        for name, a in judged.items()
    }
    return Probe(
        k=k,
        rate=rate,
        sent_rate=rate,
        verdict=verdict,
        requests=len(counts["ttft"]),
        extended=extended,
        targets=figures,
    )


def _run(engine: Engine, settings: SearchSettings, fitted: bool, precise: bool) -> list[Probe]:
    if precise:  # as the tuner measures vLLM's defaults and every finalist
        settings = replace(settings, infeasible_precision=settings.precision)
    # The window a 10 s floor and the p95 target ask at this rate (`tuner.measure`).
    needed = attainment.requests_to_resolve(95, attainment.z_value(0.95)) + 4
    probes: list[Probe] = []
    while True:
        if fitted:
            k = next_index(settings, probes, PERCENTILES)
        else:
            k = next_probe(settings, {p.k: p.verdict for p in probes})
        if k is None:
            return probes
        rate = settings.rate(k)
        window = max(math.ceil(rate * 10 * 7), needed)  # 7 req/s is the example's rate scale
        probes.append(probe(engine, k, rate, window))


TODAY = {"step": STEP, "jump": 4, "precision": 1, "infeasible_precision": 4}
"""The search before the fit: coarse steps, bisection to one step."""


def search(  # noqa: PLR0917 - the simulation's knobs, given by position from main
    rng: random.Random,
    spread: float,
    precise: bool,
    max_probes: int = MAX_PROBES,
    goal: float = GOAL,
    fitted: int = FITTED,
) -> dict[str, float | bool | None]:
    """One configuration on one engine start, searched both ways on the same engine (the same
    noise stream from the same seed)."""
    target = 1.0
    true = target * math.exp(rng.uniform(math.log(0.5), math.log(2.5)))
    second = true * rng.uniform(1.0, 1.5)
    shape = rng.choice(["logistic", "power", "knee"])
    steep = {"logistic": rng.uniform(6, 40), "power": rng.uniform(3, 12), "knee": 3.0}[shape]
    start = math.exp(rng.gauss(0, spread))  # this engine start's own factor
    order = rng.sample(list(PERCENTILES), 2)  # which target binds
    crossings = {order[0]: true * start, order[1]: second * start}
    noise = rng.getrandbits(64)

    def engine() -> Engine:
        """The same engine start, its noise drawn afresh from the same seed."""
        return Engine(crossings, _shape(shape, steep), random.Random(noise))  # noqa: S311

    base = SearchSettings(
        target_rate=target, min_rate=target / 8, max_probes=max_probes, goal=goal, fitted=fitted
    )
    today = _run(
        engine(),
        replace(base, **TODAY),  # type: ignore[arg-type]
        fitted=False,
        precise=precise,
    )
    old = capacity_of(replace(base, **TODAY), today)  # type: ignore[arg-type]
    probes = _run(engine(), base, fitted=True, precise=precise)
    found = capacity_of(base, probes, PERCENTILES, spread=spread)
    bracket = old.bracket_interval
    low, high = found.interval
    return {
        "true": true,
        "start": true * start,
        "shape": shape,
        "probes_today": len(today),
        "requests_today": sum(p.requests for p in today),
        "probes": len(probes),
        "requests": sum(p.requests for p in probes),
        "bracket": old.capacity,
        "bracket_low": bracket[0],
        "bracket_high": bracket[1],
        "fit": found.rate,
        "fit_low": low,
        "fit_high": high,
        "start_low": found.low,
        "start_high": found.high,
    }


def _covered(value: float, low: float | None, high: float | None) -> bool:
    return (low or 0.0) <= value and (high is None or value <= high)


def summarise(runs: list[dict[str, float | bool | None]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, est, low, high, truth in (
        ("bracket (today)", "bracket", "bracket_low", "bracket_high", "true"),
        ("fit, widened", "fit", "fit_low", "fit_high", "true"),
        ("fit, this start", "fit", "start_low", "start_high", "start"),
    ):
        errors = [abs(float(r[est] or 0) / float(r[truth] or 1) - 1) for r in runs]  # type: ignore[arg-type]
        covered = [_covered(float(r[truth]), r[low], r[high]) for r in runs]  # type: ignore[arg-type]
        widths = [
            float(r[high]) / float(r[low])  # type: ignore[arg-type]
            for r in runs
            if r[high] is not None and r[low]
        ]
        out[name] = {
            "coverage": sum(covered) / len(runs),
            "median_abs_error": statistics.median(errors),
            "p90_abs_error": sorted(errors)[int(0.9 * len(errors))],
            "median_width": statistics.median(widths) if widths else math.inf,
            "open": 1 - len(widths) / len(runs),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searches", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spread", type=float, default=0.05, help="between-start sigma, ln")
    parser.add_argument(
        "--precise", action="store_true", help="bracket infeasible ones finely too (baseline)"
    )
    parser.add_argument(
        "--max-probes", type=int, default=MAX_PROBES, help="the budget of both methods"
    )
    parser.add_argument(
        "--fitted", type=int, default=FITTED, help="probes the fit may place, at most"
    )
    parser.add_argument("--goal", type=float, default=GOAL, help="the fit's stopping width")
    parser.add_argument("--json", type=Path, help="write every search's figures here")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)  # noqa: S311 - reproducible simulation
    began = time.perf_counter()
    runs = [
        search(rng, args.spread, args.precise, args.max_probes, args.goal, args.fitted)
        for _ in range(args.searches)
    ]
    seconds = time.perf_counter() - began
    table = summarise(runs)

    def median(key: str) -> float:
        return statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]

    print(
        f"{args.searches} searches ({'precise' if args.precise else 'as screening'}), "
        f"between-start sigma {args.spread:g}, {seconds:.0f} s. Per search, median: today "
        f"{median('probes_today'):g} probes, {median('requests_today'):g} requests; "
        f"fit {median('probes'):g} probes, {median('requests'):g} requests"
    )
    print(f"{'method':<18} {'coverage':>9} {'median |err|':>13} {'p90 |err|':>10} "
          f"{'median hi/lo':>13} {'open':>6}")  # fmt: skip
    for name, row in table.items():
        print(
            f"{name:<18} {row['coverage']:>9.1%} {row['median_abs_error']:>13.1%} "
            f"{row['p90_abs_error']:>10.1%} {row['median_width']:>12.2f}x {row['open']:>6.1%}"
        )
    groups = [(s, [r for r in runs if r["shape"] == s]) for s in ("logistic", "power", "knee")]
    groups += [
        ("true>=tgt", [r for r in runs if float(r["true"]) >= 1]),  # type: ignore[arg-type]
        ("true<tgt", [r for r in runs if float(r["true"]) < 1]),  # type: ignore[arg-type]
    ]
    for shape, some in groups:
        row = summarise(some)["fit, widened"]
        print(
            f"  fit on {shape:<8} ({len(some)}): coverage {row['coverage']:.1%}, "
            f"median |err| {row['median_abs_error']:.1%}"
        )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "summary": table, "runs": runs}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
