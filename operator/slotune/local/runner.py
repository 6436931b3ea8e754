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
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import ValidationError

from slotune.local.process import LocalRuntime
from slotune.local.report import (
    NO_PLOTS,
    PLOTS,
    format_table,
    plots_available,
    table_rows,
    write_report,
)
from slotune.measure.probe import CapacityMeasure
from slotune.models import LLMDeployment, LLMDeploymentSpec
from slotune.runtime import EngineConfig
from slotune.tuner.gate import StudyGate
from slotune.tuner.loop import (
    Progress,
    Replicas,
    StudyResult,
    Tuner,
    TunerOptions,
    engine_config,
    versus_defaults,
)
from slotune.tuner.records import RecordStore, TrialRecord, TrialState
from slotune.tuner.space import PLATFORMS, Platform, describe_params


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


def defaults_config(
    spec: LLMDeploymentSpec,
    platform: Platform,
    model: str,
    served_name: str,
    env: tuple[tuple[str, str], ...] = (),
) -> EngineConfig:
    """vLLM's defaults on `platform` over the spec's own engine settings, as a study's first
    trial starts them: for a measurement outside a study (the machine's speed, a warm start)."""
    return engine_config(spec, platform.defaults, model, served_name, env)


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def _line(p: Progress) -> str:
    r = p.record
    m = r.measurement
    head = f"[{p.launched:>2}/{p.budget}] #{r.number:<2} {describe_params(r.params)}"
    if r.phase == "finalist":
        head += f" (re-measure of #{r.of_trial})"
    if m is None or m.capacity is None:
        body = f"{r.state}: {(r.cause or '')[:140]}"
    else:
        c = m.capacity
        probes = " ".join(f"{q.rate:.3g}:{q.verdict.lower()}" for q in c.probes)
        body = (
            f"capacity {c.describe()} "
            f"vs {_rate(c.target_rate)} needed: {c.verdict}"
            f"  (probes {probes})"
        )
        if m.quality is not None:
            body += f"\n        quality: {m.quality.describe()}: {m.quality_refused or 'passes'}"
    best = (
        f"best #{p.best.number} {p.best.measurement.capacity_rate:.3g} req/s"
        if p.best and p.best.measurement
        else "best: none feasible yet"
    )
    return f"{head}\n        {body}  |  {best}"


def _verdict(record: TrialRecord) -> str:
    m = record.measurement
    return m.capacity.verdict if m is not None and m.capacity is not None else "not measured"


def _capacity_text(record: TrialRecord) -> str:
    m = record.measurement
    if m is None or m.capacity is None:
        return "not measured"
    return m.capacity.describe()


def _summary(outcome: StudyResult, deployment: LLMDeployment) -> str:
    lines = [f"Study for {deployment.metadata.name}: {outcome.stopped_because}."]
    launched = sum(1 for r in outcome.records if r.launched)
    rejected = sum(1 for r in outcome.records if r.state == TrialState.REJECTED)
    failed = sum(1 for r in outcome.records if r.state == TrialState.FAILED)
    lines.append(
        f"{launched} launched trials ({failed} failed to start), {rejected} rejected before launch."
    )
    target = outcome.target_rate
    workload_rate = deployment.spec.tuning.workload.request_rate or 0.0
    lines.append(
        f"Target: {target:.3g} req/s (the workload's {workload_rate:g} req/s plus "
        f"{deployment.spec.tuning.headroom:.0%} headroom) within every SLO target."
    )
    ceiling = outcome.ceiling
    if ceiling is not None:
        lines.append(
            f"Ceiling (vLLM's defaults): prefill {ceiling.prefill_tps:.0f} prompt tokens/s, "
            f"i.e. {ceiling.prefill_rate:.3g} req/s of these prompts; decode "
            f"{ceiling.decode_tps:.0f} tokens/s at {ceiling.decode_concurrency} in flight."
        )

    def of_ceiling(rate: float) -> str:
        if ceiling is None or not ceiling.prefill_rate:
            return ""
        return f", {rate / ceiling.prefill_rate:.0%} of the prefill ceiling's rate"

    baseline = outcome.baseline
    if baseline is None:
        lines.append("vLLM defaults: not measured")
    else:
        lines.append(
            f"vLLM defaults (#{baseline.number}): capacity {_capacity_text(baseline)}"
            f"{of_ceiling(baseline.measurement.capacity_rate if baseline.measurement else 0)}; "
            f"{_verdict(baseline)}"
        )
    winner, confirmed = outcome.winner, outcome.confirmed
    if winner is None or confirmed is None:
        lines.append(no_winner(outcome, of_ceiling))
        return "\n".join(lines)
    lines.append(
        f"Winner (#{winner.number}, {describe_params(winner.params)}): confirmed capacity "
        f"{confirmed.describe()} over two measurements{of_ceiling(confirmed.rate)}."
    )
    if baseline is not None and baseline.measurement and baseline.measurement.capacity:
        if winner.label == "vllm-defaults":
            lines.append("vLLM's defaults are the winner: no configuration beat them.")
        elif (found := versus_defaults(outcome.records, confirmed)) is not None:
            lines.append(
                f"Winner / defaults: {found.describe()} "
                "(paired: both measured on the same arrival schedules)."
            )
    return "\n".join(lines)


def no_winner(outcome: StudyResult, of_ceiling: Callable[[float], str]) -> str:
    """The study's end when no configuration carries the target with headroom: how much the
    best one carries, re-measured where the budget allowed."""
    head = "No configuration carries the target with headroom"
    best, confirmed = outcome.best, outcome.confirmed
    if best is not None and confirmed is not None:
        found = (
            f"{head}; the best is #{best.number} ({describe_params(best.params)}): capacity "
            f"{confirmed.describe()} over two measurements{of_ceiling(confirmed.rate)}."
        )
        if (replicas := outcome.replicas) is not None:
            found += f"\n{replicas_line(replicas, outcome.target_rate, best)}"
        return found
    measured = [r for r in outcome.records if r.measurement is not None]
    if not measured:
        return f"{head}; no trial was measured."
    top = max(measured, key=lambda r: r.measurement.capacity_rate if r.measurement else 0.0)
    return (
        f"{head}; the best measured (not re-measured) is #{top.number} "
        f"({describe_params(top.params)}) at {_capacity_text(top)}."
    )


def replicas_line(replicas: Replicas, target: float, best: TrialRecord) -> str:
    """The recommendation when no configuration carries the target on one replica."""
    record = replicas.record
    name = "vLLM's defaults" if record.label == "vllm-defaults" else f"#{record.number}"
    line = (
        f"Recommendation: {replicas.count} replicas of {name} ({describe_params(record.params)})"
        f" carry the target {target:.3g} req/s ({replicas.count} x "
        f"{replicas.capacity.rate:.3g} req/s)"
    )
    if record.number != best.number:
        line += (
            f"; as few replicas of the best, #{best.number}, carry it too, and at equal GPUs "
            "the fewer overrides win"
        )
    return line + ". With scaling.mode: Capacity, slotune sizes the replicas to the live demand."


def _show(line: str) -> None:
    print(f"        {line}", flush=True)


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
    parser.add_argument(
        "--model-start",
        type=int,
        default=TunerOptions.model_start,
        metavar="N",
        help="the N trials after vLLM's defaults go where the performance model predicts the "
        "most capacity (default: %(default)s, off)",
    )
    parser.add_argument(
        "--until-confirmed",
        action="store_true",
        help="stop at the first configuration confirmed feasible (each feasible trial is "
        "re-measured at once) instead of looking on for the most capacity",
    )
    parser.add_argument("--storage", help="an Optuna storage URL (RDB or journal), optional")
    parser.add_argument(
        "--fail-without-winner",
        action="store_true",
        help="exit with status 1 when the study ends without a configuration that carries the "
        "target (by default a completed study exits 0 whatever it found: finding nothing "
        "feasible is an outcome, not an error)",
    )
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
        measure=CapacityMeasure(spec, served, log=_show),
        platform=platform,
        model=str(model),
        served_name=served,
        store=RecordStore(out / "trials.jsonl"),
        options=TunerOptions(
            patience=args.patience,
            startup_timeout=args.startup_timeout,
            model_start=args.model_start,
            until_confirmed=args.until_confirmed,
        ),
        storage=args.storage,
        extra_env=extra_env,
        gate=StudyGate.of_study(spec, platform.engine, served, out / "quality-reference.json"),
    )
    resumed = len(tuner.records)
    name = deployment.metadata.name
    print(
        f"Tuning {name}: up to {spec.tuning.max_trials} trials on {platform.name}"
        + (f", resuming after {resumed} recorded trials" if resumed else ""),
        flush=True,
    )
    print(f"Search space: {', '.join(tuner.space)}", flush=True)
    print(
        f"Each trial measures capacity: the highest request rate at which every SLO target "
        f"holds; feasible at {tuner.target_rate:.3g} req/s or more.",
        flush=True,
    )
    outcome = tuner.run(progress=lambda p: print(_line(p), flush=True))
    summary = _summary(outcome, deployment)
    report = write_report(
        out,
        outcome.records,
        tuner.slo,
        tuner.space,
        title=f"slotune study: {deployment.metadata.name}",
        summary=summary,
        winner=outcome.winner,
        best=outcome.best,
    )
    print()
    print(format_table(table_rows(outcome.records, tuner.slo)))
    print()
    print(summary)
    shown = f"plots: {', '.join(PLOTS)}" if plots_available() else NO_PLOTS
    print(f"Report: {report} ({shown})", flush=True)
    return 1 if args.fail_without_winner and outcome.winner is None else 0
