"""Goodput of vLLM's defaults and of the study's best configuration: a request-rate sweep.

Goodput here is the highest request rate at which both SLO percentiles still hold. Each
configuration gets one engine start (the same LocalRuntime the tuner uses) and is driven at
rising Poisson rates with the study's request shape; the SLO is judged by the tuner's own
reduction (`slotune.tuner.measure.reduce`). Both configurations run in the same call, so the
target-rate figures of the two stand side by side.

"vLLM's defaults" here means no tuned flag at all (only the spec's maxModelLen): the engine
resolves its own defaults, as a user who sets nothing gets them. The best configuration is
picked from the study's records as the tuner picks its winner (the best feasible screening
trial whose re-measurement also held, scored by the worse of the two); with none confirmed it
is the trial whose screening run came closest to the SLO, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from slotune import loadgen
from slotune.models import EngineArgs
from slotune.runtime import EngineConfig
from slotune.runtime.local import LocalRuntime
from slotune.tuner.local import load_deployment
from slotune.tuner.measure import WARMUP_REQUESTS, reduce
from slotune.tuner.records import RecordStore, TrialRecord


def pick_best(records: list[TrialRecord]) -> tuple[TrialRecord | None, str]:
    screened = sorted(
        (r for r in records if r.phase == "screen" and r.feasible),
        key=lambda r: r.score,
        reverse=True,
    )[:2]
    confirmed = []
    for candidate in screened:
        again = [r for r in records if r.phase == "finalist" and r.of_trial == candidate.number]
        if not again:
            confirmed.append((candidate.score, candidate, "met the SLO (not re-measured)"))
        elif again[-1].feasible:
            score = min(candidate.score, again[-1].score)
            confirmed.append((score, candidate, "met the SLO, confirmed by re-measurement"))
    if confirmed:
        _, best, why = max(confirmed, key=lambda c: c[0])
        return best, why
    measured = [r for r in records if r.phase == "screen" and r.measurement is not None]
    if not measured:
        return None, "no trial was measured"
    closest = min(measured, key=lambda r: max(r.constraints))
    return closest, "none confirmed; this one's screening run came closest to the SLO"


def main() -> int:  # noqa: PLR0915 - one linear script: configurations x rates
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--rates", default="8,12,16,20,24,28")
    parser.add_argument("--target-rate", type=float, default=16.0)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per rate")
    parser.add_argument("--seconds", type=float, default=580.0, help="end within this")
    parser.add_argument("--vllm-python", type=Path, default=Path("python3"))
    args = parser.parse_args()
    began = time.monotonic()
    deployment = load_deployment(args.spec)
    spec = deployment.spec
    if spec.slo is None:
        raise SystemExit("the spec needs an slo")
    served = spec.model.served_name or deployment.metadata.name
    workload_spec = spec.tuning.workload
    if workload_spec.prompt_tokens is None or workload_spec.output_tokens is None:
        raise SystemExit("the workload needs promptTokens and outputTokens")
    targets = {name: t.max_seconds for name, t in spec.slo.targets().items()}
    rates = [float(r) for r in args.rates.split(",")]
    best, why = pick_best(RecordStore(args.records).load())
    configs: list[tuple[str, dict[str, Any], str]] = [
        ("vllm-defaults", {}, "no tuned flag: vLLM 0.24 resolves its own defaults"),
    ]
    if best is not None:
        configs.append((f"best (trial #{best.number})", dict(best.params), why))
    runtime = LocalRuntime(args.vllm_python, args.work, dummy_weights=True)
    result: dict[str, Any] = {
        "slo": {name: {"percentile": t.percentile, "max_seconds": t.max_seconds}
                for name, t in spec.slo.targets().items()},
        "workload": {"prompt_tokens": workload_spec.prompt_tokens.mean,
                     "output_tokens": workload_spec.output_tokens.mean,
                     "seconds_per_rate": args.duration, "arrivals": "Poisson",
                     "warmup_requests": WARMUP_REQUESTS},
        "configs": [],
    }  # fmt: skip
    for label, params, note in configs:
        engine_args = EngineArgs.model_validate({**spec.engine.args.explicit(), **params})
        config = EngineConfig(model=args.model_dir, served_name=served, args=engine_args)
        entry: dict[str, Any] = {
            "label": label,
            "params": params,
            "note": note,
            "flags": runtime.command(config, 0)[3:],
            "points": [],
        }
        result["configs"].append(entry)
        print(f"Starting {label}: {' '.join(entry['flags'])}", flush=True)
        engine = runtime.start(config, timeout=400)
        entry["startup_seconds"] = engine.facts.startup_seconds
        entry["kv_cache_tokens"] = engine.facts.kv_cache_tokens
        print(f"Started {label} in {engine.facts.startup_seconds:.0f} s", flush=True)
        try:
            missed_above_target = False
            for index, rate in enumerate(rates):
                if missed_above_target:
                    break
                left = args.seconds - (time.monotonic() - began)
                if rate != args.target_rate and left < 2.5 * args.duration + 30:
                    print(f"Skipped {label} at {rate:g} req/s: {left:.0f} s left", flush=True)
                    continue
                workload = loadgen.Workload(
                    num_requests=max(round(rate * args.duration), 8),
                    # A fresh seed per rate: the same seed would replay the same prompts into
                    # the same engine, and prefix caching would skip their prefill.
                    seed=spec.tuning.seed + 100 + index,
                    rate=rate,
                    prompt_tokens=workload_spec.prompt_tokens.mean,
                    prompt_spread=workload_spec.prompt_tokens.spread,
                    output_tokens=workload_spec.output_tokens.mean,
                    output_spread=workload_spec.output_tokens.spread,
                    warmup_requests=WARMUP_REQUESTS,
                )
                results = asyncio.run(loadgen.run_workload(engine.base_url, served, workload))
                m = reduce(results, spec.slo)
                met = all(
                    m.slo_percentiles.get(name) is not None and m.slo_percentiles[name] <= limit  # type: ignore[operator]
                    for name, limit in targets.items()
                )
                point = {
                    "rate": rate,
                    "met": met,
                    **{f"{name}_p{spec.slo.targets()[name].percentile:g}": v
                       for name, v in m.slo_percentiles.items()},
                    "ttft_p95": m.ttft_p95,
                    "tpot_p95": m.tpot_p95,
                    "itl_p95": m.itl_p95,
                    "e2e_p95": m.e2e_p95,
                    "request_throughput": m.request_throughput,
                    "output_throughput": m.output_throughput,
                    "goodput": m.goodput,
                    "completed": m.completed,
                    "failed": m.failed,
                    "send_rate": m.send_rate,
                    "scheduling_lag_p99": m.scheduling_lag_p99,
                }  # fmt: skip
                entry["points"].append(point)
                print(
                    f"  {label} @ {rate:g} req/s: ttft p95 {m.ttft_p95 or float('nan'):.3f} s, "
                    f"tpot p95 {m.tpot_p95 or float('nan'):.4f} s, {m.request_throughput:.2f} "
                    f"req/s done, SLO {'met' if met else 'missed'}",
                    flush=True,
                )
                if not met and rate >= args.target_rate:
                    missed_above_target = True
        finally:
            engine.stop()
        held = [p["rate"] for p in entry["points"] if p["met"]]
        entry["goodput_rate"] = max(held, default=None)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({c["label"]: c["goodput_rate"] for c in result["configs"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
