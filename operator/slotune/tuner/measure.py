"""Measuring a running engine under the spec's workload, with the load generator."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path

from slotune import loadgen
from slotune.models import LLMDeploymentSpec, SloSpec, WorkloadSpec, seconds
from slotune.slo import evaluate_samples
from slotune.tuner.records import Measurement

WARMUP_REQUESTS = 4


def loadgen_workload(workload: WorkloadSpec, seed: int) -> loadgen.Workload:
    """The load generator's view of a Synthetic workload spec."""
    if workload.prompt_tokens is None or workload.output_tokens is None:
        raise ValueError("a measured workload needs promptTokens and outputTokens")
    duration = seconds(workload.duration)
    if workload.request_rate is not None:
        count = max(round(workload.request_rate * duration), 8)
    else:
        count = max(int((workload.concurrency or 1) * 4), 8)
    return loadgen.Workload(
        num_requests=count,
        seed=seed,
        rate=workload.request_rate,
        concurrency=workload.concurrency,
        prompt_tokens=workload.prompt_tokens.mean,
        prompt_spread=workload.prompt_tokens.spread,
        output_tokens=workload.output_tokens.mean,
        output_spread=workload.output_tokens.spread,
        shared_prefix_ratio=workload.shared_prefix_ratio,
        warmup_requests=WARMUP_REQUESTS,
    )


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def reduce(results: list[loadgen.RequestResult], slo: SloSpec) -> Measurement:
    """The figures the tuner decides on, from per-request samples."""
    ok = [r for r in results if r.ok]
    samples: dict[str, list[float]] = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [t for r in ok if r.output_tokens > 1 and (t := r.tpot) is not None],
        "itl": [gap for r in ok for gap in r.itls],  # every gap, as vLLM's ITL histogram
        "e2e": [r.e2e for r in ok],
    }
    verdict = evaluate_samples(slo, samples)
    thresholds = {name: t.max_seconds for name, t in slo.targets().items()}
    summary = loadgen.summarize(results, thresholds)
    return Measurement(
        slo_percentiles={name: t.observed_seconds for name, t in verdict.targets.items()},
        ttft_p95=_finite(summary.ttft.p95),
        tpot_p95=_finite(summary.tpot.p95),
        itl_p95=_finite(summary.itl.p95),
        e2e_p95=_finite(summary.e2e.p95),
        request_throughput=summary.request_throughput,
        output_throughput=summary.output_throughput,
        goodput=summary.goodput or 0.0,
        completed=summary.completed,
        failed=summary.failed,
        send_rate=summary.send_rate,
        scheduling_lag_p99=_finite(summary.scheduling_lag.p99),
    )


class LoadgenMeasure:
    """Drives the spec's workload at an engine's URL and reduces what it saw."""

    def __init__(self, spec: LLMDeploymentSpec, served_name: str) -> None:
        if spec.slo is None:
            raise ValueError("tuning needs spec.slo")
        self.slo = spec.slo
        self.workload = spec.tuning.workload
        self.served_name = served_name

    def __call__(self, base_url: str, seed: int) -> Measurement:
        workload = loadgen_workload(self.workload, seed)
        results = asyncio.run(loadgen.run_workload(base_url, self.served_name, workload))
        return reduce(results, self.slo)


def trial_load_main(argv: list[str]) -> int:
    """`slotune trial-load`: what a trial's load Job runs in the cluster.

    Drives the engine at --url with the workload, reduces what it saw against the SLO and
    writes the measurement as JSON to --result-file (the container's termination message,
    which the operator reads back from the pod's status) and to stdout.
    """
    parser = argparse.ArgumentParser(prog="slotune trial-load", description=trial_load_main.__doc__)
    parser.add_argument("--url", required=True, help="the engine, e.g. http://10.0.0.7:8000")
    parser.add_argument("--model", required=True, help="its served model name")
    parser.add_argument("--workload", required=True, help="spec.tuning.workload, as JSON")
    parser.add_argument("--slo", required=True, help="spec.slo, as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-file", type=Path, default=None)
    args = parser.parse_args(argv)
    workload = WorkloadSpec.model_validate_json(args.workload)
    slo = SloSpec.model_validate_json(args.slo)
    results = asyncio.run(
        loadgen.run_workload(args.url, args.model, loadgen_workload(workload, args.seed))
    )
    measurement = reduce(results, slo)
    text = measurement.model_dump_json(exclude_none=True)
    if args.result_file is not None:
        args.result_file.write_text(text)
    sys.stdout.write(text + "\n")
    return 0
