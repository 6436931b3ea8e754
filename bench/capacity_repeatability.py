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
and bench/results/verdict-flips.json (part 2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from tuner_comparison import EXAMPLE, MODEL, ROOT, vllm_python

from slotune import capacity
from slotune.attainment import SLO_METRICS
from slotune.capacity import MeasureRequest, required_rate
from slotune.models import EngineArgs
from slotune.runtime import EngineConfig
from slotune.runtime.local import LocalRuntime
from slotune.stats import percentile
from slotune.tuner.local import load_deployment
from slotune.tuner.measure import CapacityMeasure
from slotune.tuner.space import CPU


def start(runtime: LocalRuntime, spec: Any, params: dict[str, Any]) -> Any:
    config = EngineConfig(
        model=str(MODEL),
        served_name="tiny",
        args=EngineArgs.model_validate({**spec.engine.args.explicit(), **params}),
        env=(("VLLM_CPU_KVCACHE_SPACE", "2"),),
    )
    return runtime.start(config, timeout=300)


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


def main() -> int:  # noqa: PLR0915 - one linear script: two parts, printed as they go
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=EXAMPLE)
    parser.add_argument("--params", default=None, help="the configuration, JSON (default: vLLM's)")
    parser.add_argument("--engines", type=int, default=5)
    parser.add_argument("--seed", type=int, default=100, help="engine i uses seed + i")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--rates", default=None, help="part 2's rates, comma-separated (default: around part 1's)"
    )
    parser.add_argument("--out", type=Path, default=Path("tune-out/bench-capacity"))
    args = parser.parse_args()
    deployment = load_deployment(args.spec)
    spec = deployment.spec
    if spec.slo is None:
        raise SystemExit(f"{args.spec}: needs spec.slo")
    params = json.loads(args.params) if args.params else dict(CPU.defaults)
    target = required_rate(spec.tuning.workload.request_rate or 1.0, spec.tuning.headroom)
    runtime = LocalRuntime(vllm_python(), args.out / "engines", dummy_weights=True)
    measure = CapacityMeasure(spec, "tiny", log=lambda line: print("    " + line, flush=True))

    print(f"== repeatability: {params} on {args.engines} fresh engines", flush=True)
    found = []
    for i in range(args.engines):
        began = time.monotonic()
        engine = start(runtime, spec, params)
        try:
            request = MeasureRequest(seed=args.seed + i, target_rate=target, precise=True)
            m = measure(engine.base_url, request)
        finally:
            engine.stop()
        if m.capacity is None:
            raise SystemExit("the measurement found no capacity")
        found.append(m.capacity)
        print(f"  engine {i + 1}: {m.capacity.describe()}  ({time.monotonic() - began:.0f} s)")
    lows = [c.capacity for c in found] or [0.0]
    # The stated intervals (brackets widened by the run-to-run spread): do they share a rate?
    interval_lows = [c.interval[0] for c in found]
    interval_highs = [h for c in found if (h := c.interval[1]) is not None]
    shared = max(interval_lows) < min(interval_highs) if interval_highs else True
    inside = sum(
        1
        for c in found
        for other in found
        if other is not c
        and other.interval[0] <= c.capacity
        and (other.interval[1] is None or c.capacity < other.interval[1])
    )
    pairs = len(found) * (len(found) - 1)
    spread = max(lows) / min(lows) if min(lows) > 0 else float("inf")
    print(
        f"  capacity median {statistics.median(lows):.3g} req/s, spread {spread:.2f}x "
        f"(highest/lowest); all intervals share a rate: {shared}; a capacity inside another "
        f"engine's interval: {inside} of {pairs} pairs"
    )

    if found:
        result = {
            "spec": str(args.spec),
            "params": params,
            "target_rate": target,
            "restart_spread_steps": capacity.RESTART_SPREAD,
            "capacities": [c.model_dump(mode="json", exclude={"probes"}) for c in found],
            "intervals": [c.interval for c in found],
            "spread": spread,
            "intervals_share_a_rate": shared,
            "inside_pairs": [inside, pairs],
        }
        write(result, f"capacity-repeatability-seed{args.seed}.json")
    if not args.repeats:
        return 0

    if args.rates:
        rates = [float(r) for r in args.rates.split(",")]
    elif found:  # the median bracket and one grid step either side of it
        low = statistics.median(lows)
        rates = [low / capacity.STEP, low, low * capacity.STEP, low * capacity.STEP**2]
    else:
        raise SystemExit("part 2 alone needs --rates")
    print(f"\n== verdicts at {', '.join(f'{r:.3g}' for r in rates)} req/s, {args.repeats} "
          "fresh schedules each, the rates interleaved", flush=True)  # fmt: skip
    engine = start(runtime, spec, params)
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
        "verdict-flips.json",
    )
    return 0


def write(result: dict[str, Any], name: str) -> None:
    path = ROOT / "bench" / "results" / name
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"Wrote {path.relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
