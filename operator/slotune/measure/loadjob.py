"""The load Job's argument contract: what `render` writes into a trial's load Job and what
`slotune trial-load` (`measure.probe.trial_load_main`) reads back, in one place, so that the
two cannot drift. It carries the engine's kind, so that the measurement reads the metric names
and patterns of the engine the trial runs (`slotune.engine.engine_for`), not vLLM's by default."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from slotune.engine import DEFAULT_KIND, ENGINES
from slotune.measure.capacity import Ceiling, MeasureRequest
from slotune.models import LLMDeploymentSpec, QualitySpec, SloSpec, WorkloadSpec


@dataclass(frozen=True)
class LoadArgs:
    """One trial's measurement, as the load Job's container is told it."""

    url: str
    model: str
    workload: WorkloadSpec
    slo: SloSpec
    request: MeasureRequest
    engine: str = DEFAULT_KIND
    result_file: Path | None = None
    quality: QualitySpec | None = None
    """The quality gate's bounds, for a lossy configuration; the reference is `reference_url`."""
    reference_url: str | None = None

    def argv(self) -> list[str]:
        """The arguments after `slotune trial-load`."""
        args = [
            "--url",
            self.url,
            "--model",
            self.model,
            "--engine",
            self.engine,
            "--workload",
            self.workload.model_dump_json(by_alias=True, exclude_none=True),
            "--slo",
            self.slo.model_dump_json(by_alias=True, exclude_none=True),
            "--seed",
            str(self.request.seed),
            "--target-rate",
            f"{self.request.target_rate:.6g}",
        ]
        if self.result_file is not None:
            args += ["--result-file", str(self.result_file)]
        if self.request.measure_ceiling:
            args.append("--measure-ceiling")
        if self.request.ceiling is not None:
            args += ["--ceiling", self.request.ceiling.model_dump_json()]
        if self.request.precise:
            args.append("--precise")
        if self.request.spread:
            args += ["--spread", f"{self.request.spread:.6g}"]
        if self.quality is not None:
            args += ["--quality", self.quality.model_dump_json(by_alias=True)]
        if self.reference_url is not None:
            args += ["--reference-url", self.reference_url]
        return args

    @classmethod
    def parse(cls, argv: list[str], description: str | None = None) -> LoadArgs:
        """`argv()` read back; a bad argument exits with argparse's message."""
        parser = argparse.ArgumentParser(prog="slotune trial-load", description=description)
        parser.add_argument("--url", required=True, help="the engine, e.g. http://10.0.0.7:8000")
        parser.add_argument("--model", required=True, help="its served model name")
        parser.add_argument(
            "--engine",
            choices=sorted(ENGINES),
            default=DEFAULT_KIND,
            help="spec.engine.kind: whose metric names and patterns the measurement reads",
        )
        parser.add_argument("--workload", required=True, help="spec.tuning.workload, as JSON")
        parser.add_argument("--slo", required=True, help="spec.slo, as JSON")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--target-rate", type=float, required=True, help="the rate to carry, headroom included"
        )
        parser.add_argument("--ceiling", help="the study's measured ceiling, as JSON")
        parser.add_argument(
            "--measure-ceiling", action="store_true", help="measure the engine's ceilings first"
        )
        parser.add_argument(
            "--precise", action="store_true", help="bracket finely even when infeasible (baseline)"
        )
        parser.add_argument(
            "--spread",
            type=float,
            default=0.0,
            help="the platform's between-start spread (sd of ln rate), added to the interval",
        )
        parser.add_argument("--result-file", type=Path, default=None)
        parser.add_argument(
            "--quality", help="tuning.quality, as JSON: gate the engine's quality after measuring"
        )
        parser.add_argument(
            "--reference-url", help="the quality gate's reference engine (the serving Service)"
        )
        args = parser.parse_args(argv)
        return cls(
            url=args.url,
            model=args.model,
            engine=args.engine,
            workload=WorkloadSpec.model_validate_json(args.workload),
            slo=SloSpec.model_validate_json(args.slo),
            request=MeasureRequest(
                seed=args.seed,
                target_rate=args.target_rate,
                measure_ceiling=args.measure_ceiling,
                ceiling=Ceiling.model_validate_json(args.ceiling) if args.ceiling else None,
                precise=args.precise,
                spread=args.spread,
            ),
            result_file=args.result_file,
            quality=QualitySpec.model_validate_json(args.quality) if args.quality else None,
            reference_url=args.reference_url,
        )

    def spec(self) -> LLMDeploymentSpec:
        """The spec the measurement works from: the served model, the engine's kind, the SLO
        and the workload."""
        return LLMDeploymentSpec.model_validate(
            {
                "model": {"name": self.model},
                "engine": {"kind": self.engine},
                "slo": self.slo.model_dump(by_alias=True, exclude_none=True),
                "tuning": {"workload": self.workload.model_dump(by_alias=True, exclude_none=True)},
            }
        )
