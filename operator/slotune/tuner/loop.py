"""The tuning loop, shared by the operator and `slotune tune --local`.

One trial: ask Optuna for a configuration, check vLLM's known rules (a configuration that breaks
one is recorded as rejected and never launched), start it on the runtime (a start that fails is
an infeasible observation with its cause), measure it under the workload, judge the SLO from
per-request samples, tell Optuna. The study is seeded with vLLM's defaults and the current
configuration, stops when the SLO is met and further trials stop paying (or at maxTrials), and
re-measures its finalists before it declares a winner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import optuna
from pydantic import ValidationError

from slotune.engine import vllm
from slotune.models import EngineArgs, LLMDeploymentSpec
from slotune.runtime import EngineConfig, EngineStartError, Runtime
from slotune.tuner import study as studies
from slotune.tuner.records import Measurement, RecordStore, TrialRecord, TrialState
from slotune.tuner.space import Platform, Space, build_space, clamp_into

Measure = Callable[[str, int], Measurement]
"""(engine base URL, workload seed) -> what the load run saw."""

MAX_REJECTIONS = 64


@dataclass(frozen=True)
class TunerOptions:
    patience: int = 4
    min_improvement: float = 0.02
    finalists: int = 2
    startup_timeout: float = 300.0
    seed_with_defaults: bool = True


@dataclass(frozen=True)
class Launch:
    """How one configuration fared on the runtime."""

    state: TrialState
    measurement: Measurement | None = None
    facts: dict[str, Any] | None = None
    cause: str | None = None
    failure_kind: str | None = None


@dataclass
class Progress:
    """What a progress display shows after each trial."""

    record: TrialRecord
    launched: int
    budget: int
    best: TrialRecord | None
    message: str = ""


@dataclass
class Outcome:
    records: list[TrialRecord]
    winner: TrialRecord | None
    baseline: TrialRecord | None
    stopped_because: str
    space: dict[str, str] = field(default_factory=dict)


def _score(objective: str, measurement: Measurement, constraints: list[float]) -> float:
    if objective == "Throughput":
        return measurement.request_throughput
    if objective == "Latency":
        return -max(constraints, default=0.0)
    return measurement.goodput


class Tuner:
    """Runs one study for one LLMDeployment spec on one runtime."""

    def __init__(
        self,
        spec: LLMDeploymentSpec,
        *,
        runtime: Runtime,
        measure: Measure,
        platform: Platform,
        model: str,
        served_name: str,
        store: RecordStore,
        options: TunerOptions | None = None,
        storage: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        extra_env: tuple[tuple[str, str], ...] = (),
        sampler: optuna.samplers.BaseSampler | None = None,
        space: Space | None = None,
    ) -> None:
        if spec.slo is None:
            raise ValueError("tuning needs spec.slo")
        self.spec = spec
        self.slo = spec.slo
        self.runtime = runtime
        self.measure = measure
        self.platform = platform
        self.model = model
        self.served_name = served_name
        self.store = store
        self.options = options or TunerOptions()
        self.clock = clock
        self.extra_env = extra_env
        self.space: Space = space or build_space(platform, spec.tuning.search_space)
        self.records = store.load()
        # A rebuilt study gets a sampler seed moved on by the trials it already holds: the
        # same seed would replay the first random draws and repeat configurations.
        resumed = sum(1 for r in self.records if r.phase == "screen")
        self.study = studies.create_study(
            spec.tuning.seed + resumed, storage=storage, sampler=sampler
        )
        studies.rebuild(self.study, self.space, self.slo, self.records)

    # -- configurations --------------------------------------------------------------------

    def _merged(self, params: dict[str, Any]) -> dict[str, Any]:
        """The spec's own settings with the trial's params on top."""
        return {**self.spec.engine.args.explicit(), **params}

    def engine_args(self, params: dict[str, Any]) -> EngineArgs:
        return EngineArgs.model_validate(self._merged(params))

    def _problems(self, params: dict[str, Any]) -> list[str]:
        """vLLM's rule table first (its messages name the rule), then the field ranges."""
        unchecked = EngineArgs.model_construct(**self._merged(params))
        backend: Any = self.platform.backend
        problems = vllm.check_config(unchecked, self.spec.engine.extra_args, backend)
        if problems:
            return [str(v) for v in problems]
        try:
            self.engine_args(params)
        except ValidationError as error:
            return [str(e["msg"]) for e in error.errors()]
        return []

    def seed_params(self) -> list[tuple[str, dict[str, Any]]]:
        """vLLM's defaults, then the current configuration, moved into the space."""
        defaults = clamp_into(self.space, self.platform.defaults)
        current = clamp_into(
            self.space, {**self.platform.defaults, **self.spec.engine.args.explicit()}
        )
        seeds = [("vllm-defaults", defaults)]
        if current != defaults:
            seeds.append(("current", current))
        return seeds

    # -- one trial -------------------------------------------------------------------------

    def _launch(self, params: dict[str, Any], seed: int) -> Launch:
        """Starts, measures and stops one configuration."""
        config = EngineConfig(
            model=self.model,
            served_name=self.served_name,
            args=self.engine_args(params),
            extra_args=tuple(self.spec.engine.extra_args),
            env=tuple((v.name, v.value) for v in self.spec.engine.env) + self.extra_env,
        )
        try:
            engine = self.runtime.start(config, timeout=self.options.startup_timeout)
        except EngineStartError as error:
            failure = error.failure
            return Launch(
                TrialState.FAILED, cause=failure.describe(), failure_kind=str(failure.kind)
            )
        try:
            measurement = self.measure(engine.base_url, seed)
        finally:
            engine.stop()
        return Launch(TrialState.MEASURED, measurement=measurement, facts=asdict(engine.facts))

    def _record(
        self,
        number: int,
        params: dict[str, Any],
        *,
        phase: Literal["screen", "finalist"] = "screen",
        label: str | None = None,
        seed: int,
        of_trial: int | None = None,
    ) -> TrialRecord:
        began = self.clock()
        problems = self._problems(params)
        if problems:
            launch = Launch(TrialState.REJECTED, cause="; ".join(problems))
        else:
            launch = self._launch(params, seed)
        measurement = launch.measurement
        if measurement is None:
            constraints = studies.infeasible_constraints(self.slo)
            score = 0.0
        else:
            constraints = studies.slo_constraints(self.slo, measurement)
            score = _score(self.spec.tuning.objective, measurement, constraints)
        record = TrialRecord(
            number=number,
            phase=phase,
            label=label,
            params=params,
            state=launch.state,
            cause=launch.cause,
            failure_kind=launch.failure_kind,
            facts=launch.facts,
            measurement=measurement,
            score=score,
            constraints=constraints,
            feasible=measurement is not None and all(c <= 0 for c in constraints),
            seconds=self.clock() - began,
            of_trial=of_trial,
        )
        self.store.append(record)
        self.records.append(record)
        return record

    # -- the study ---------------------------------------------------------------------------

    def _best(self) -> TrialRecord | None:
        feasible = [r for r in self.records if r.phase == "screen" and r.feasible]
        return max(feasible, key=lambda r: r.score, default=None)

    def _launched(self) -> int:
        return sum(1 for r in self.records if r.launched)

    def _stale(self) -> bool:
        """The SLO is met and the last `patience` launched trials did not beat the best."""
        best = self._best()
        if best is None:
            return False
        later = [
            r for r in self.records if r.phase == "screen" and r.launched and r.number > best.number
        ]
        return len(later) >= self.options.patience

    def run(self, progress: Callable[[Progress], None] | None = None) -> Outcome:
        budget = self.spec.tuning.max_trials
        screening_budget = max(budget - self.options.finalists, 1)
        done_labels = {r.label for r in self.records if r.label}
        seeds = self.seed_params() if self.options.seed_with_defaults else []
        for seed_label, params in seeds:
            if seed_label not in done_labels:
                self.study.enqueue_trial(params, user_attrs={"label": seed_label})

        rejections = 0
        stopped = "maxTrials reached"
        while self._launched() < screening_budget:
            if self._stale():
                stopped = f"SLO met and {self.options.patience} trials brought no improvement"
                break
            trial = self.study.ask(self.space)
            label: str | None = trial.user_attrs.get("label")
            number = len([r for r in self.records if r.phase == "screen"])
            record = self._record(
                number, dict(trial.params), label=label, seed=self.spec.tuning.seed
            )
            studies.tell(self.study, trial, record, self.slo)
            if record.state == TrialState.REJECTED:
                rejections += 1
                if rejections > MAX_REJECTIONS:
                    stopped = "the search space holds almost no valid configuration"
                    break
                continue
            if progress is not None:
                progress(Progress(record, self._launched(), budget, self._best()))

        winner = self._confirm_finalists(budget, progress)
        baseline = next((r for r in self.records if r.label == "vllm-defaults"), None)
        return Outcome(
            records=list(self.records),
            winner=winner,
            baseline=baseline,
            stopped_because=stopped,
            space={name: repr(dist) for name, dist in self.space.items()},
        )

    def _confirm_finalists(
        self, budget: int, progress: Callable[[Progress], None] | None
    ) -> TrialRecord | None:
        """Re-measures the best feasible configurations under a different arrival order;
        the winner is the best worst case among those that stay feasible."""
        screened = sorted(
            (r for r in self.records if r.phase == "screen" and r.feasible),
            key=lambda r: r.score,
            reverse=True,
        )[: self.options.finalists]
        confirmed: list[tuple[float, TrialRecord]] = []
        for candidate in screened:
            previous = [
                r for r in self.records if r.phase == "finalist" and r.of_trial == candidate.number
            ]
            if previous:
                again = previous[-1]
            elif self._launched() < budget:
                again = self._record(
                    len(self.records),
                    candidate.params,
                    phase="finalist",
                    label=candidate.label,
                    seed=self.spec.tuning.seed + 1,
                    of_trial=candidate.number,
                )
                if progress is not None:
                    progress(Progress(again, self._launched(), budget, candidate, "re-measured"))
            else:
                again = candidate  # no budget left to re-measure: trust the screening run
            if again.feasible:
                confirmed.append((min(candidate.score, again.score), candidate))
        if not confirmed:
            return None
        return max(confirmed, key=lambda pair: pair[0])[1]
