"""vLLM's defaults and the study's winner side by side in one run: each one's capacity, and the
engine's prefill ceiling.

Each configuration gets a fresh engine start (the LocalRuntime the tuner uses) and the same
capacity search the trials run (`slotune.tuner.measure.CapacityMeasure`), on the same arrival
schedules: one workload seed, unused by the study (its screening used `seed`, its
re-measurements `seed + 1`), so neither configuration is judged on the arrivals it was picked
on. The prefill and decode ceilings are measured on the defaults' engine.

"vLLM's defaults" means no tuned flag at all (only the spec's maxModelLen): the engine resolves
its own defaults, as a user who sets nothing gets them. The winner is the one the tuner
declares from the study's records; with none it is the record with the highest capacity, and
the output says so.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from slotune.capacity import MeasureRequest, required_rate
from slotune.models import EngineArgs
from slotune.runtime import EngineConfig
from slotune.runtime.local import LocalRuntime
from slotune.tuner.local import load_deployment
from slotune.tuner.loop import Finished, Tuner
from slotune.tuner.measure import CapacityMeasure
from slotune.tuner.records import MemoryStore, RecordStore, TrialRecord
from slotune.tuner.space import PLATFORMS


def pick_winner(spec: Any, records: list[TrialRecord], platform: str) -> tuple[Any, str]:
    tuner = Tuner(
        spec,
        runtime=None,
        measure=None,
        platform=PLATFORMS[platform],
        model="-",
        served_name="-",
        store=MemoryStore(records),
    )
    planned = tuner.plan()
    if isinstance(planned, Finished) and planned.winner is not None:
        return planned.winner, "the study's confirmed winner"
    measured = [r for r in records if r.measurement is not None and r.measurement.capacity]
    if not measured:
        return None, "no trial was measured"
    best = max(measured, key=lambda r: r.measurement.capacity_rate if r.measurement else 0.0)
    return best, "no confirmed winner yet: the record with the highest capacity"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--platform", default="h200")
    parser.add_argument("--vllm-python", type=Path, default=Path("python3"))
    args = parser.parse_args()
    deployment = load_deployment(args.spec)
    spec = deployment.spec
    served = spec.model.served_name or deployment.metadata.name
    rate = spec.tuning.workload.request_rate
    if spec.slo is None or rate is None:
        raise SystemExit("the spec needs an slo and a workload requestRate")
    target = required_rate(rate, spec.tuning.headroom)
    winner, why = pick_winner(spec, RecordStore(args.records).load(), args.platform)
    configs: list[tuple[str, dict[str, Any], str]] = [
        ("vllm-defaults", {}, "no tuned flag: vLLM resolves its own defaults"),
    ]
    if winner is not None:
        configs.append((f"winner (trial #{winner.number})", dict(winner.params), why))
    runtime = LocalRuntime(args.vllm_python, args.work, dummy_weights=True)
    measure = CapacityMeasure(spec, served, log=lambda line: print("  " + line, flush=True))
    result: dict[str, Any] = {"target_rate": target, "seed": spec.tuning.seed + 2, "configs": []}
    ceiling = None
    for label, params, note in configs:
        engine_args = EngineArgs.model_validate({**spec.engine.args.explicit(), **params})
        config = EngineConfig(model=args.model_dir, served_name=served, args=engine_args)
        print(f"Starting {label}: {' '.join(runtime.command(config, 0)[3:])}", flush=True)
        engine = runtime.start(config, timeout=400)
        try:
            request = MeasureRequest(
                seed=spec.tuning.seed + 2,
                target_rate=target,
                measure_ceiling=ceiling is None,
                ceiling=ceiling,
                precise=True,
            )
            m = measure(engine.base_url, request)
        finally:
            engine.stop()
        ceiling = ceiling or m.ceiling
        entry = {
            "label": label,
            "params": params,
            "note": note,
            "startup_seconds": engine.facts.startup_seconds,
            "kv_cache_tokens": engine.facts.kv_cache_tokens,
            "capacity": m.capacity.model_dump(mode="json") if m.capacity else None,
        }
        result["configs"].append(entry)
        result["ceiling"] = ceiling.model_dump(mode="json") if ceiling else None
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{label}: capacity {m.capacity.describe() if m.capacity else '-'}", flush=True)
    caps = [c["capacity"] for c in result["configs"] if c["capacity"]]
    if ceiling is not None and ceiling.prefill_rate:
        for c in caps:
            c["fraction_of_prefill_ceiling"] = round(c["capacity"] / ceiling.prefill_rate, 4)
    if len(caps) == 2 and caps[0]["capacity"] > 0:
        result["ratio_winner_to_defaults"] = round(caps[1]["capacity"] / caps[0]["capacity"], 4)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "configs"}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
