"""Benchmark: how well one trial's measurement holds up, on the real vLLM CPU engine.

1. **Repeatability.** One configuration's capacity, measured on `--engines` fresh engine
   starts, each with a fresh arrival schedule (another workload seed). It prints every
   capacity interval, the spread (highest capacity over lowest), and whether all the
   intervals share a rate.
2. **Verdict error near the boundary.** On one more engine, `--repeats` probes at one rate
   near the configuration's boundary (by default the median of the upper ends found in part
   1), each on a fresh schedule. Each probe is judged twice: by the capacity search's rule
   (Wilson interval on attainment, extended while open, `Unresolved` if still open) and by the
   old rule (the exact p95 of the probe's base window against the bound: pass or fail, always).
   It prints how often each rule's verdicts contradict one another across the repeats: the
   share of the minority among its passes and fails. An unresolved verdict is not a flip; it is
   reported as such.

    .venv/bin/python bench/capacity_repeatability.py --engines 5 --repeats 10

Uses the `make tune` example (examples/tune-cpu.yaml) and its vLLM defaults unless --params
gives another configuration as JSON. Writes bench/results/capacity-repeatability.json.
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
from slotune.capacity import MeasureRequest, ProbeVerdict, required_rate
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


def main() -> int:  # noqa: PLR0915 - one linear script: two parts, printed as they go
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=EXAMPLE)
    parser.add_argument("--params", default=None, help="the configuration, JSON (default: vLLM's)")
    parser.add_argument("--engines", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rate", type=float, default=None, help="the rate of part 2")
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
            m = measure(engine.base_url, MeasureRequest(seed=100 + i, target_rate=target,
                                                        precise=True))  # fmt: skip
        finally:
            engine.stop()
        if m.capacity is None:
            raise SystemExit("the measurement found no capacity")
        found.append(m.capacity)
        print(f"  engine {i + 1}: {m.capacity.describe()}  ({time.monotonic() - began:.0f} s)")
    lows = [c.capacity for c in found] or [0.0]
    uppers = [c.upper for c in found if c.upper is not None]
    shared = max(lows) < min(uppers) if uppers else True
    spread = max(lows) / min(lows) if min(lows) > 0 else float("inf")
    print(
        f"  capacity median {statistics.median(lows):.3g} req/s, spread {spread:.2f}x "
        f"(highest/lowest); all intervals share a rate: {shared}"
    )

    rate = args.rate or (statistics.median(uppers) if uppers else target)
    print(f"\n== verdicts at {rate:.3g} req/s, {args.repeats} fresh schedules", flush=True)
    engine = start(runtime, spec, params)
    new: list[str] = []
    old: list[str] = []
    try:

        async def run_all() -> None:
            probe_engine = measure.engine(engine.base_url)
            lifetime = await measure.warm_up(engine.base_url)
            for i in range(args.repeats):
                seed = capacity.schedule_seed(200 + i, 0)
                run = await measure.probe(engine.base_url, probe_engine, k=0, rate=rate,
                                          seed=seed, lifetime=lifetime)  # fmt: skip
                lifetime = run.lifetime
                new.append(str(run.probe.verdict))
                old.append("Pass" if old_verdict(run, spec.slo) else "Fail")
                print(f"  repeat {i + 1}: interval rule {run.probe.verdict:<10} old rule "
                      f"{old[-1]}  ({run.probe.requests} requests)", flush=True)  # fmt: skip

        asyncio.run(run_all())
    finally:
        engine.stop()
    unresolved = sum(1 for v in new if v in (ProbeVerdict.UNRESOLVED, ProbeVerdict.UNSTABLE))
    print(
        f"\n  old single-run p95 rule: {old.count('Pass')} pass / {old.count('Fail')} fail: "
        f"flip rate {flips(old):.0%}\n"
        f"  interval rule:           {new.count('Pass')} pass / {new.count('Fail')} fail / "
        f"{unresolved} unresolved: flip rate {flips(new):.0%}"
    )
    result = {
        "spec": str(args.spec),
        "params": params,
        "target_rate": target,
        "capacities": [c.model_dump(mode="json", exclude={"probes"}) for c in found],
        "spread": spread,
        "intervals_share_a_rate": shared,
        "boundary_rate": rate,
        "interval_verdicts": new,
        "old_verdicts": old,
        "flip_rate_interval": flips(new),
        "flip_rate_old": flips(old),
    }
    path = ROOT / "bench" / "results" / "capacity-repeatability.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nWrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
