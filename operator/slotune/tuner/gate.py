"""The quality gate in a study that allows lossy settings (`tuning.quality.allowLossy`).

vLLM's defaults are always a study's first trial and always lossless: their engine takes the
reference (`slotune.measure.quality`) after its capacity is measured. Every later trial whose
configuration is lossy is held to it after its own measurement, on the same sequences; one that
fails a bound keeps its measured capacity in the record but is infeasible, with the gate's
words as its cause. Lossless trials are not gated: their numbers are the reference's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slotune.engine.base import Engine
from slotune.engine.knobs import lossy_settings
from slotune.measure.record import Measurement
from slotune.measure.scoring import Reference, Scorer, shaped_prompts
from slotune.models import LLMDeploymentSpec, WorkloadSpec

REFERENCE_LABEL = "vllm-defaults"


class StudyGate:
    """The gate of one study: takes the reference on the defaults' trial and holds every lossy
    trial to it. The reference is kept in `path` where given, so that a resumed study has it."""

    def __init__(
        self,
        spec: LLMDeploymentSpec,
        engine: Engine,
        served_name: str,
        path: Path | None = None,
    ) -> None:
        self.bounds = spec.tuning.quality
        self.workload: WorkloadSpec = spec.tuning.workload
        self.seed = spec.tuning.seed
        self.engine = engine
        self.served_name = served_name
        self.path = path
        self.reference: Reference | None = None
        if path is not None and path.exists():
            self.reference = Reference.from_json(path.read_text())

    def lossy(self, settings: dict[str, Any]) -> bool:
        """Whether a configuration (every setting, merged) holds a lossy value."""
        return bool(lossy_settings(self.engine.knobs, settings))

    @classmethod
    def of_study(
        cls, spec: LLMDeploymentSpec, engine: Engine, served_name: str, path: Path | None
    ) -> StudyGate | None:
        """The study's gate, or None where it allows no lossy setting."""
        return cls(spec, engine, served_name, path) if spec.tuning.quality.allow_lossy else None

    def after(
        self, label: str | None, settings: dict[str, Any], url: str, measured: Measurement
    ) -> Measurement:
        """A trial's measurement (its engine at `url`), gated: the reference taken, or the
        figures and the verdict."""
        scorer = Scorer(url, self.served_name)
        if label == REFERENCE_LABEL and not self.lossy(settings):
            if self.reference is None:
                self.reference = Reference.take(
                    scorer,
                    shaped_prompts(self.bounds, self.workload, self.seed),
                    self.bounds.generated_tokens,
                )
                if self.path is not None:
                    self.path.write_text(self.reference.to_json())
            return measured
        if not self.lossy(settings):
            return measured
        if self.reference is None:
            return measured.model_copy(
                update={
                    "quality_refused": "quality gate: no reference was taken (vLLM's defaults "
                    "were measured without the gate); start a new study to gate lossy settings"
                }
            )
        return measured.gated(self.reference.hold(scorer), self.bounds)
