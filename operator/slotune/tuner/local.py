"""`slotune tune --local FILE`: the tuner against vLLM processes on this machine.

Reads an LLMDeployment-shaped file, runs the study with the local runtime (the CPU engine
here, a GPU engine where there is one), shows each trial as it finishes, and writes the records
and a report. Interrupted, it resumes from its records when run again with the same --out.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from slotune.models import LLMDeployment
from slotune.runtime.local import LocalRuntime
from slotune.tuner.loop import Outcome, Progress, Tuner, TunerOptions
from slotune.tuner.measure import LoadgenMeasure
from slotune.tuner.records import RecordStore, TrialRecord, TrialState
from slotune.tuner.report import format_table, table_rows, write_report
from slotune.tuner.space import PLATFORMS, describe_params


def load_deployment(path: Path) -> LLMDeployment:
    """The file's LLMDeployment, or a SystemExit that says what to fix."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    found = [d for d in docs if d.get("kind") == "LLMDeployment"]
    if len(found) != 1:
        raise SystemExit(f"{path}: expected exactly one LLMDeployment, found {len(found)}")
    try:
        deployment = LLMDeployment.model_validate(found[0])
    except ValidationError as error:
        problems = "\n".join(
            f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise SystemExit(f"{path} is not a valid LLMDeployment:\n{problems}") from error
    spec = deployment.spec
    if spec.slo is None:
        raise SystemExit(f"{path}: set spec.slo; the tuner needs an SLO to tune for")
    if spec.tuning.workload.source != "Synthetic":
        raise SystemExit(
            f"{path}: a local study needs spec.tuning.workload.source: Synthetic with "
            "promptTokens, outputTokens and requestRate or concurrency (there is no live "
            "traffic to copy here)"
        )
    return deployment


def _line(p: Progress) -> str:
    r = p.record
    m = r.measurement
    head = f"[{p.launched:>2}/{p.budget}] #{r.number:<2} {describe_params(r.params)}"
    if r.phase == "finalist":
        head += f" (re-measure of #{r.of_trial})"
    if m is None:
        body = f"{r.state}: {(r.cause or '')[:140]}"
    else:
        figures = "  ".join(
            f"{name} p {value * 1000:.0f}ms" if value is not None else f"{name} -"
            for name, value in m.slo_percentiles.items()
        )
        body = (
            f"{figures}  {m.request_throughput:.2f} req/s  goodput {m.goodput:.2f}  "
            f"SLO {'met' if r.feasible else 'missed'}"
        )
    best = f"best #{p.best.number} {p.best.score:.2f}" if p.best else "best: none meets the SLO yet"
    return f"{head}\n        {body}  |  {best}"


def _summary(outcome: Outcome, deployment: LLMDeployment) -> str:
    lines = [f"Study for {deployment.metadata.name}: {outcome.stopped_because}."]
    launched = sum(1 for r in outcome.records if r.launched)
    rejected = sum(1 for r in outcome.records if r.state == TrialState.REJECTED)
    failed = sum(1 for r in outcome.records if r.state == TrialState.FAILED)
    lines.append(
        f"{launched} launched trials ({failed} failed to start), {rejected} rejected before launch."
    )

    def show(label: str, record: TrialRecord | None) -> None:
        if record is None or record.measurement is None:
            lines.append(f"{label}: not measured")
            return
        m = record.measurement
        figures = ", ".join(
            f"{k} p{deployment.spec.slo.targets()[k].percentile:g} "  # type: ignore[union-attr]
            f"{v * 1000:.0f} ms"
            if v is not None
            else f"{k} -"
            for k, v in m.slo_percentiles.items()
        )
        lines.append(
            f"{label} (#{record.number}, {describe_params(record.params)}): {figures}; "
            f"goodput {m.goodput:.2f} req/s; SLO {'met' if record.feasible else 'MISSED'}"
        )

    show("vLLM defaults", outcome.baseline)
    if outcome.winner is None:
        lines.append("No configuration met the SLO (confirmed by re-measurement).")
    else:
        show("Winner", outcome.winner)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slotune tune", description=__doc__)
    parser.add_argument("file", type=Path, help="an LLMDeployment YAML with slo and tuning")
    parser.add_argument("--local", action="store_true", required=True, help="run vLLM locally")
    parser.add_argument("--out", type=Path, help="records and report (default: tune-out/NAME)")
    parser.add_argument(
        "--vllm-python",
        type=Path,
        default=Path(os.environ.get("SLOTUNE_VLLM_PYTHON", sys.executable)),
        help="a python with vLLM installed (default: $SLOTUNE_VLLM_PYTHON)",
    )
    parser.add_argument(
        "--model-dir", help="a local model folder (default: spec.model.name when it is a folder)"
    )
    parser.add_argument(
        "--dummy-weights",
        action="store_true",
        help="random weights and token-id prompts (a folder with only config.json)",
    )
    parser.add_argument("--platform", choices=sorted(PLATFORMS), default="cpu")
    parser.add_argument(
        "--kv-cache-gib", type=int, default=2, help="CPU engine: VLLM_CPU_KVCACHE_SPACE"
    )
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--patience", type=int, default=4)
    parser.add_argument("--storage", help="an Optuna storage URL (RDB or journal), optional")
    return parser


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the engine of the trial in flight is stopped too."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _stop_on_sigterm()
    deployment = load_deployment(args.file)
    spec = deployment.spec
    platform = PLATFORMS[args.platform]
    model = args.model_dir or spec.model.name
    if not Path(model).is_dir() and args.dummy_weights:
        raise SystemExit(f"--dummy-weights needs a model folder with a config.json, not {model!r}")
    served = spec.model.served_name or deployment.metadata.name
    out = args.out or Path("tune-out") / deployment.metadata.name
    extra_env: tuple[tuple[str, str], ...] = ()
    if platform.name == "cpu":
        extra_env = (("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib)),)
    tuner = Tuner(
        spec,
        runtime=LocalRuntime(args.vllm_python, out / "engines", dummy_weights=args.dummy_weights),
        measure=LoadgenMeasure(spec, served),
        platform=platform,
        model=str(model),
        served_name=served,
        store=RecordStore(out / "trials.jsonl"),
        options=TunerOptions(patience=args.patience, startup_timeout=args.startup_timeout),
        storage=args.storage,
        extra_env=extra_env,
    )
    resumed = len(tuner.records)
    name = deployment.metadata.name
    print(
        f"Tuning {name}: up to {spec.tuning.max_trials} trials on {platform.name}"
        + (f", resuming after {resumed} recorded trials" if resumed else ""),
        flush=True,
    )
    print(f"Search space: {', '.join(tuner.space)}", flush=True)
    outcome = tuner.run(progress=lambda p: print(_line(p), flush=True))
    summary = _summary(outcome, deployment)
    report = write_report(
        out,
        outcome.records,
        tuner.slo,
        tuner.space,
        title=f"slotune study: {deployment.metadata.name}",
        summary=summary,
    )
    print()
    print(format_table(table_rows(outcome.records, tuner.slo)))
    print()
    print(summary)
    print(f"Report: {report} (plots: history.png, slo.png, importance.png)")
    return 0 if outcome.winner is not None else 1
