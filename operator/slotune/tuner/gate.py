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
from slotune.measure.scoring import (
    SCORING_ERRORS,
    Reference,
    Scorer,
    not_scored,
    reference_key,
    take_reference,
)
from slotune.models import LLMDeploymentSpec, WorkloadSpec

REFERENCE_LABEL = "vllm-defaults"


class StudyGate:
    """The gate of one study: takes the reference on the defaults' trial and holds every lossy
    trial to it. The reference is kept in `path` where given, so that a resumed study has it; a
    kept reference taken for another model, prompts or workload shape is not used."""

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
        self.key = reference_key(spec.model.name, self.bounds, self.workload, self.seed)
        self.reference: Reference | None = None
        self.missing = (
            "quality gate: no reference: vLLM's defaults' trial took none (it failed to start, "
            "or was measured before the gate); start a new study to gate lossy settings"
        )
        if path is not None and path.exists():
            try:
                kept = Reference.from_json(path.read_text())
            except (ValueError, KeyError, TypeError):
                kept = None
            if kept is not None and kept.key == self.key:
                self.reference = kept

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
        figures and the verdict. A gate that cannot score refuses the configuration (it was
        not shown to pass) and keeps its capacity; the study goes on."""
        lossy = self.lossy(settings)
        scorer = Scorer(url, self.served_name)
        if label == REFERENCE_LABEL:
            if lossy:
                self.missing = (
                    "quality gate: no lossless reference: spec.engine.args sets a lossy value, "
                    "so vLLM's defaults in this study are lossy too"
                )
            elif self.reference is None:
                try:
                    self.reference = take_reference(scorer, self.bounds, self.workload, self.seed)
                except SCORING_ERRORS as error:
                    self.missing = not_scored(error) + " (the reference, on vLLM's defaults)"
                    return measured
                if self.path is not None:
                    self.reference.save(self.path)
        if not lossy:
            return measured
        if self.reference is None:
            return measured.model_copy(update={"quality_refused": self.missing})
        try:
            figures = self.reference.hold(scorer)
        except SCORING_ERRORS as error:
            return measured.model_copy(update={"quality_refused": not_scored(error)})
        return measured.gated(figures, self.bounds)
