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
from slotune.tuner.records import Measurement, Store, TrialRecord, TrialState
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


@dataclass(frozen=True)
class NextTrial:
    """A trial the study wants run next."""

    number: int
    params: dict[str, Any]
    seed: int
    phase: Literal["screen", "finalist"] = "screen"
    label: str | None = None
    of_trial: int | None = None


@dataclass(frozen=True)
class Finished:
    """The study is over: its winner (None when no configuration was confirmed) and why."""

    winner: TrialRecord | None
    stopped_because: str


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
        runtime: Runtime | None,
        measure: Measure | None,
        platform: Platform,
        model: str,
        served_name: str,
        store: Store,
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
        self._pending: dict[int, optuna.Trial] = {}
        if self.options.seed_with_defaults:
            done = {r.label for r in self.records if r.label}
            for label, params in self.seed_params():
                if label not in done:
                    self.study.enqueue_trial(params, user_attrs={"label": label})

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

    def _config(self, params: dict[str, Any]) -> EngineConfig:
        return EngineConfig(
            model=self.model,
            served_name=self.served_name,
            args=self.engine_args(params),
            extra_args=tuple(self.spec.engine.extra_args),
            env=tuple((v.name, v.value) for v in self.spec.engine.env) + self.extra_env,
        )

    def _launch(self, params: dict[str, Any], seed: int) -> Launch:
        """Starts, measures and stops one configuration."""
        if self.runtime is None or self.measure is None:
            raise RuntimeError("this tuner only plans trials; it has no runtime to launch them")
        try:
            engine = self.runtime.start(self._config(params), timeout=self.options.startup_timeout)
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

    def outcome(self, planned: NextTrial, launch: Launch, seconds: float) -> TrialRecord:
        """The record of a planned trial, from how its launch fared (wherever it ran)."""
        measurement = launch.measurement
        if measurement is None:
            constraints = studies.infeasible_constraints(self.slo)
            score = 0.0
        else:
            constraints = studies.slo_constraints(self.slo, measurement)
            score = _score(self.spec.tuning.objective, measurement, constraints)
        return TrialRecord(
            number=planned.number,
            phase=planned.phase,
            label=planned.label,
            params=planned.params,
            state=launch.state,
            cause=launch.cause,
            failure_kind=launch.failure_kind,
            facts=launch.facts,
            measurement=measurement,
            score=score,
            constraints=constraints,
            feasible=measurement is not None and all(c <= 0 for c in constraints),
            seconds=seconds,
            of_trial=planned.of_trial,
        )

    def record(self, record: TrialRecord) -> None:
        """Keeps a finished trial: in the store, in memory, and in the study it was asked from."""
        self.store.append(record)
        self.records.append(record)
        pending = self._pending.pop(record.number, None)
        if pending is not None:
            studies.tell(self.study, pending, record, self.slo)

    def _run_trial(self, planned: NextTrial) -> TrialRecord:
        began = self.clock()
        launch = self._launch(planned.params, planned.seed)
        record = self.outcome(planned, launch, self.clock() - began)
        self.record(record)
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

    def _screening_stop(self) -> str | None:
        """Why screening is over, or None while it goes on."""
        budget = self.spec.tuning.max_trials
        rejected = sum(1 for r in self.records if r.state == TrialState.REJECTED)
        if rejected > MAX_REJECTIONS:
            return "the search space holds almost no valid configuration"
        if self._stale():
            return f"SLO met and {self.options.patience} trials brought no improvement"
        if self._launched() >= max(budget - self.options.finalists, 1):
            return "maxTrials reached"
        if any(r.phase == "finalist" for r in self.records):
            return "screening finished"
        return None

    def plan(self) -> NextTrial | Finished:
        """The next trial to launch, or the study's end with its winner.

        Depends only on the records (and the seeded sampler), so a study rebuilt from its
        records after a restart plans the same next step. Configurations that break one of
        vLLM's known rules are recorded as rejected here and never returned.
        """
        while (stopped := self._screening_stop()) is None:
            trial = self.study.ask(self.space)
            planned = NextTrial(
                number=len([r for r in self.records if r.phase == "screen"]),
                params=dict(trial.params),
                label=trial.user_attrs.get("label"),
                seed=self.spec.tuning.seed,
            )
            self._pending[planned.number] = trial
            problems = self._problems(planned.params)
            if not problems:
                return planned
            rejected = Launch(TrialState.REJECTED, cause="; ".join(problems))
            self.record(self.outcome(planned, rejected, 0.0))
        return self._plan_finalists(stopped)

    def _finalists(self) -> list[TrialRecord]:
        return sorted(
            (r for r in self.records if r.phase == "screen" and r.feasible),
            key=lambda r: r.score,
            reverse=True,
        )[: self.options.finalists]

    def _plan_finalists(self, stopped: str) -> NextTrial | Finished:
        """Re-measures the best feasible configurations under a different arrival order;
        the winner is the best worst case among those that stay feasible."""
        budget = self.spec.tuning.max_trials
        confirmed: list[tuple[float, TrialRecord]] = []
        for candidate in self._finalists():
            previous = [
                r for r in self.records if r.phase == "finalist" and r.of_trial == candidate.number
            ]
            if previous:
                again = previous[-1]
            elif self._launched() < budget:
                return NextTrial(
                    number=len(self.records),
                    params=candidate.params,
                    phase="finalist",
                    label=candidate.label,
                    seed=self.spec.tuning.seed + 1,
                    of_trial=candidate.number,
                )
            else:
                again = candidate  # no budget left to re-measure: trust the screening run
            if again.feasible:
                confirmed.append((min(candidate.score, again.score), candidate))
        winner = max(confirmed, key=lambda pair: pair[0])[1] if confirmed else None
        return Finished(winner=winner, stopped_because=stopped)

    def run(self, progress: Callable[[Progress], None] | None = None) -> Outcome:
        """Plans and runs trials on the runtime until the study ends."""
        budget = self.spec.tuning.max_trials
        while isinstance(planned := self.plan(), NextTrial):
            record = self._run_trial(planned)
            if progress is not None:
                candidate = next((r for r in self.records if r.number == planned.of_trial), None)
                if planned.phase == "finalist":
                    progress(Progress(record, self._launched(), budget, candidate, "re-measured"))
                else:
                    progress(Progress(record, self._launched(), budget, self._best()))
        baseline = next((r for r in self.records if r.label == "vllm-defaults"), None)
        return Outcome(
            records=list(self.records),
            winner=planned.winner,
            baseline=baseline,
            stopped_because=planned.stopped_because,
            space={name: repr(dist) for name, dist in self.space.items()},
        )
