"""The tuning loop, shared by the operator and `slotune tune --local`.

One trial: ask Optuna for a configuration, check vLLM's known rules (a configuration that breaks
one is recorded as rejected and never launched), start it on the runtime (a start that fails is
an infeasible observation with its cause), measure its capacity under the workload (the
highest rate at which every SLO target holds, `slotune.measure.capacity`), tell Optuna. A
configuration is feasible when its capacity reaches the target rate with headroom; feasible ones are
ranked by capacity. The study is seeded with vLLM's defaults (whose trial also measures the engine's
ceilings, once per study) and the current configuration; it stops at maxTrials, when further trials
stop paying, or when the best carries all the prefill ceiling allows, and re-measures its finalists
on a fresh schedule before it declares a winner: the best confirmed capacity, and among winners
whose intervals overlap, the one closest to vLLM's defaults.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import optuna
from pydantic import ValidationError

from slotune.engine.knobs import lossy_settings
from slotune.measure.capacity import (
    AtTarget,
    Capacity,
    Ceiling,
    MeasureRequest,
    attainment_at_upper,
    pool_starts,
    required_rate,
    versus,
)
from slotune.measure.crossing import Comparison, Difference
from slotune.measure.record import Measurement
from slotune.models import EngineArgs, LLMDeploymentSpec
from slotune.runtime import EngineConfig, EngineStartError, Runtime
from slotune.tuner import perfmodel, sampling
from slotune.tuner.records import Store, TrialRecord, TrialState, study_ceiling
from slotune.tuner.space import Platform, Space, build_space, clamp_into

Measure = Callable[[str, MeasureRequest], Measurement]
"""(engine base URL, what to measure) -> what the measurement saw."""

MAX_REJECTIONS = 64


def engine_config(
    spec: LLMDeploymentSpec,
    params: dict[str, Any],
    model: str,
    served_name: str,
    env: tuple[tuple[str, str], ...] = (),
) -> EngineConfig:
    """The engine a trial of `params` starts: the spec's own settings with the params on top."""
    return EngineConfig(
        model=model,
        served_name=served_name,
        args=EngineArgs.model_validate({**spec.engine.args.explicit(), **params}),
        extra_args=tuple(spec.engine.extra_args),
        env=tuple((v.name, v.value) for v in spec.engine.env) + env,
    )


@dataclass(frozen=True)
class TunerOptions:
    patience: int = 4
    min_improvement: float = 0.02
    finalists: int = 2
    startup_timeout: float = 300.0
    seed_with_defaults: bool = True
    model_start: int = 0
    """How many trials after vLLM's defaults go where the performance model
    (`slotune.tuner.perfmodel`), fed the ceilings the defaults' trial measured, predicts the
    most capacity; 0 leaves every later trial to the sampler."""
    until_confirmed: bool = False
    """Stops at the first configuration confirmed feasible: each feasible screening trial is
    re-measured at once (a fresh engine, a new arrival order), and the study ends when a
    re-measurement holds. It measures how many launched trials reach the SLO (the benchmark of
    the model-guided start); the default study goes on to look for the most capacity."""


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
    """The study is over: its winner (None when no configuration was confirmed), why, and
    the winner's confirmed capacity (what both of its measurements allow). When no configuration
    is feasible, `best` is the one that carries the most, and `confirmed` its capacity over
    its two measurements."""

    winner: TrialRecord | None
    stopped_because: str
    confirmed: Capacity | None = None
    best: TrialRecord | None = None
    replicas: Replicas | None = None  # with no winner: the fewest replicas that carry the target


@dataclass(frozen=True)
class Replicas:
    """`count` replicas of `record`'s configuration, whose re-measured capacity is `capacity`,
    carry the target together."""

    record: TrialRecord
    capacity: Capacity
    count: int


def fewest_replicas(
    candidates: list[tuple[Capacity, TrialRecord]], target: float, defaults: dict[str, Any]
) -> Replicas | None:
    """The cheapest way to carry `target` with re-measured configurations that each carry
    less: the fewest replicas (GPUs: every replica takes the spec's), then the fewest overrides
    of vLLM's defaults, then the highest capacity."""
    found = [
        Replicas(record, capacity, math.ceil(target / capacity.rate - 1e-9))
        for capacity, record in candidates
        if capacity.rate > 0 and target > 0
    ]
    return min(
        found,
        key=lambda r: (r.count, overrides(r.record.params, defaults), -r.capacity.rate),
        default=None,
    )


@dataclass
class Progress:
    """What a progress display shows after each trial."""

    record: TrialRecord
    launched: int
    budget: int
    best: TrialRecord | None
    message: str = ""


@dataclass
class StudyResult:
    records: list[TrialRecord]
    winner: TrialRecord | None
    baseline: TrialRecord | None
    stopped_because: str
    space: dict[str, str] = field(default_factory=dict)
    target_rate: float = 0.0
    ceiling: Ceiling | None = None
    confirmed: Capacity | None = None  # the winner's (or, with none, the best's) capacity
    best: TrialRecord | None = None  # with no winner: the configuration that carries the most
    replicas: Replicas | None = None  # with no winner: the fewest replicas that carry the target


def _score(objective: str, measurement: Measurement, bounds: dict[str, float]) -> float:
    """Goodput: capacity (req/s); Throughput: output tokens/s at capacity; Latency: minus the
    worst target's percentile over its bound, at the target rate."""
    if objective == "Throughput":
        return measurement.output_throughput
    if objective == "Latency":
        ratios = [
            (value or bounds[name] * 10) / bounds[name]
            for name, value in measurement.slo_percentiles.items()
            if name in bounds
        ]
        return -max(ratios, default=0.0)
    return measurement.capacity_rate


def overrides(params: dict[str, Any], defaults: dict[str, Any]) -> int:
    """How many settings differ from vLLM's defaults (a tie goes to the fewest)."""
    return sum(1 for name, value in params.items() if defaults.get(name) != value)


# -- scoring a trial: pure, from the spec and the records, no Optuna study needed ------------


def merged(spec: LLMDeploymentSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The spec's own settings with the trial's params on top."""
    return {**spec.engine.args.explicit(), **params}


def target_rate(spec: LLMDeploymentSpec) -> float:
    """The rate a feasible configuration carries (the workload's, with headroom)."""
    rate = spec.tuning.workload.request_rate
    if rate is None:
        raise ValueError(
            "the tuner measures capacity in requests/s: give tuning.workload.requestRate"
        )
    return required_rate(rate, spec.tuning.headroom)


def measure_request(
    spec: LLMDeploymentSpec,
    platform: Platform,
    records: list[TrialRecord],
    planned: NextTrial,
    *,
    rate: float | None = None,
) -> MeasureRequest:
    """What the measurement of a planned trial is asked: the rate to carry (from `rate`,
    the live workload's, when given), and for the first launched trial (vLLM's defaults)
    the ceilings too, when none is known yet."""
    ceiling = study_ceiling(records)
    target = target_rate(spec) if rate is None else required_rate(rate, spec.tuning.headroom)
    return MeasureRequest(
        seed=planned.seed,
        target_rate=target,
        measure_ceiling=ceiling is None and planned.phase == "screen",
        ceiling=ceiling,
        # The baseline, and every re-measurement, is bracketed finely: a finalist's
        # capacity is what the study reports.
        precise=planned.label == "vllm-defaults" or planned.phase == "finalist",
        spread=platform.spread,
    )


def record_of(
    spec: LLMDeploymentSpec, planned: NextTrial, launch: Launch, seconds: float
) -> TrialRecord:
    """The record of a planned trial, from how its launch fared (wherever it ran)."""
    if spec.slo is None:
        raise ValueError("tuning needs spec.slo")
    measurement = launch.measurement
    if measurement is None:
        constraints = sampling.infeasible_constraints()
        score = 0.0
    else:
        constraints = sampling.capacity_constraints(measurement)
        if measurement.quality_refused:
            constraints = sampling.refused_constraints(constraints)
        bounds = {name: t.max_seconds for name, t in spec.slo.targets().items()}
        score = _score(spec.tuning.objective, measurement, bounds)
    return TrialRecord(
        number=planned.number,
        phase=planned.phase,
        label=planned.label,
        params=planned.params,
        state=launch.state,
        cause=launch.cause or (measurement.quality_refused if measurement else None),
        failure_kind=launch.failure_kind,
        facts=launch.facts,
        measurement=measurement,
        score=score,
        constraints=constraints,
        feasible=measurement is not None and all(c <= 0 for c in constraints),
        seconds=seconds,
        of_trial=planned.of_trial,
    )


class Planner:
    """Plans one study for one LLMDeployment spec, from its records: which trial next, or the
    end with its winner; and what a trial's launch makes of its record. No I/O: the operator
    runs it at every step of a study in the cluster (`slotune.study`), `Tuner` around a
    runtime for `tune --local`."""

    def __init__(
        self,
        spec: LLMDeploymentSpec,
        *,
        platform: Platform,
        model: str,
        served_name: str,
        records: Sequence[TrialRecord] = (),
        options: TunerOptions | None = None,
        storage: str | None = None,
        extra_env: tuple[tuple[str, str], ...] = (),
        sampler: optuna.samplers.BaseSampler | None = None,
        space: Space | None = None,
    ) -> None:
        if spec.slo is None:
            raise ValueError("tuning needs spec.slo")
        self.spec = spec
        self.slo = spec.slo
        self.platform = platform
        self.model = model
        self.served_name = served_name
        self.options = options or TunerOptions()
        self.extra_env = extra_env
        self.space: Space = space or build_space(
            platform, spec.tuning.search_space, allow_lossy=spec.tuning.quality.allow_lossy
        )
        self.records = list(records)
        self.rejected: list[TrialRecord] = []
        """Configurations `plan` found breaking the engine's rules, recorded as rejected and
        never returned: the caller keeps them with the study's records."""
        # A rebuilt study gets a sampler seed moved on by the trials it already holds: the
        # same seed would replay the first random draws and repeat configurations.
        resumed = sum(1 for r in self.records if r.phase == "screen")
        self.study = sampling.create_study(
            spec.tuning.seed + resumed, storage=storage, sampler=sampler
        )
        sampling.rebuild(self.study, self.space, self.slo, self.records)
        self._pending: dict[int, optuna.Trial] = {}
        self._model_planned = False
        if self.options.seed_with_defaults:
            done = {r.label for r in self.records if r.label}
            for label, params in self.seed_params():
                if label not in done:
                    self.study.enqueue_trial(params, user_attrs={"label": label})

    # -- configurations --------------------------------------------------------------------

    def merged(self, params: dict[str, Any]) -> dict[str, Any]:
        """The spec's own settings with the trial's params on top."""
        return merged(self.spec, params)

    def engine_args(self, params: dict[str, Any]) -> EngineArgs:
        return EngineArgs.model_validate(self.merged(params))

    def problems(self, params: dict[str, Any]) -> list[str]:
        """The engine's rule table first (its messages name the rule), then the field ranges."""
        unchecked = EngineArgs.model_construct(**self.merged(params))
        backend: Any = self.platform.backend
        problems = self.platform.engine.check_config(
            unchecked, self.spec.engine.extra_args, backend, self.spec.engine.image
        )
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
        return engine_config(self.spec, params, self.model, self.served_name, self.extra_env)

    @property
    def target_rate(self) -> float:
        """The rate a feasible configuration carries (the workload's, with headroom)."""
        return target_rate(self.spec)

    @property
    def ceiling(self) -> Ceiling | None:
        """The engine's ceilings, measured once per study (on vLLM's defaults)."""
        return study_ceiling(self.records)

    def measure_request(self, planned: NextTrial, rate: float | None = None) -> MeasureRequest:
        """What the measurement of a planned trial is asked (`measure_request`)."""
        return measure_request(self.spec, self.platform, self.records, planned, rate=rate)

    def record_of(self, planned: NextTrial, launch: Launch, seconds: float) -> TrialRecord:
        """The record of a planned trial, from how its launch fared (`record_of`)."""
        return record_of(self.spec, planned, launch, seconds)

    def record(self, record: TrialRecord) -> None:
        """Keeps a finished trial in memory and tells the study it was asked from."""
        self.records.append(record)
        pending = self._pending.pop(record.number, None)
        if pending is not None:
            sampling.tell(self.study, pending, record, self.slo)

    # -- the study ---------------------------------------------------------------------------

    def _best(self) -> TrialRecord | None:
        feasible = [r for r in self.records if r.phase == "screen" and r.feasible]
        return max(feasible, key=lambda r: r.score, default=None)

    def _stale(self) -> bool:
        """The SLO is met and the last `patience` launched trials did not beat the best."""
        best = self._best()
        if best is None:
            return False
        later = [
            r for r in self.records if r.phase == "screen" and r.launched and r.number > best.number
        ]
        return len(later) >= self.options.patience

    def _at_ceiling(self) -> bool:
        """The best passed at the highest rate the prefill ceiling lets a probe ask: no
        configuration can carry more, so no further trial can beat it."""
        best = self._best()
        if best is None or best.measurement is None or best.measurement.capacity is None:
            return False
        found = best.measurement.capacity
        return found.upper is None and "ceiling" in found.stopped

    def _screening_stop(self) -> str | None:
        """Why screening is over, or None while it goes on."""
        budget = self.spec.tuning.max_trials
        rejected = sum(1 for r in self.records if r.state == TrialState.REJECTED)
        if rejected > MAX_REJECTIONS:
            return "the search space holds almost no valid configuration"
        if self._at_ceiling():
            return "the best configuration carries all the prefill ceiling allows"
        if self._stale():
            return f"SLO met and {self.options.patience} trials brought no improvement"
        if _launched(self.records) >= max(budget - self.options.finalists, 1):
            return "maxTrials reached"
        if not self.options.until_confirmed and any(r.phase == "finalist" for r in self.records):
            return "screening finished"
        return None

    def plan(self) -> NextTrial | Finished:
        """The next trial to launch, or the study's end with its winner.

        Depends only on the records (and the seeded sampler), so a study rebuilt from its
        records after a restart plans the same next step. Configurations that break one of
        the engine's known rules are recorded as rejected (listed in `rejected`) and never
        returned.
        """
        if self.options.until_confirmed and (
            confirming := confirm_feasible(self.spec, self.platform, self.records)
        ):
            return confirming
        while (stopped := self._screening_stop()) is None:
            self._queue_model_start()
            trial = self.study.ask(self.space)
            planned = NextTrial(
                # Every record counts: with `until_confirmed`, re-measurements come between screens.
                number=len(self.records),
                params=dict(trial.params),
                label=trial.user_attrs.get("label"),
                seed=self.spec.tuning.seed,
            )
            self._pending[planned.number] = trial
            problems = self.problems(planned.params)
            if not problems:
                return planned
            rejected = self.record_of(
                planned, Launch(TrialState.REJECTED, cause="; ".join(problems)), 0.0
            )
            self.rejected.append(rejected)
            self.record(rejected)
        return plan_finalists(self.spec, self.platform, self.options, self.records, stopped)

    def _queue_model_start(self) -> None:
        """Once vLLM's defaults are measured (with the engine's ceilings), queues the
        configurations the performance model ranks best (`model_start`)."""
        if self.options.model_start <= 0 or self._model_planned:
            return
        queued = model_start(self.spec, self.platform, self.space, self.options, self.records)
        if queued is None:
            return
        self._model_planned = True
        for label, params in queued:
            self.study.enqueue_trial(params, user_attrs={"label": label})


# -- the study's end: finalists, their re-measurement and the winner ---------------------------


def refused(spec: LLMDeploymentSpec, platform: Platform, record: TrialRecord) -> bool:
    """Whether a trial cannot win on quality, whatever its capacity: it failed the quality
    gate, or the study drew a lossy value for it and no gate passed it (a record from before
    lossy values needed `allowLossy`, or of a runner without the gate). A lossy value the
    spec's own engine.args set is the author's choice, not the study's."""
    measured = record.measurement
    if measured is not None and measured.quality_refused is not None:
        return True
    own = spec.engine.args.explicit()
    drawn = [
        name
        for name in lossy_settings(platform.engine.knobs, record.params)
        if own.get(name) != record.params[name]
    ]
    return bool(drawn) and not (
        spec.tuning.quality.allow_lossy and measured is not None and measured.quality
    )


def _launched(records: Sequence[TrialRecord]) -> int:
    return sum(1 for r in records if r.launched)


def _measured_target(records: Sequence[TrialRecord]) -> float:
    found = (r.measurement.capacity for r in records if r.measurement is not None)
    return next((c.target_rate for c in found if c is not None), 0.0)


def _re_measurements(records: Sequence[TrialRecord], candidate: TrialRecord) -> list[TrialRecord]:
    return [r for r in records if r.phase == "finalist" and r.of_trial == candidate.number]


def _re_measure(
    spec: LLMDeploymentSpec, records: Sequence[TrialRecord], candidate: TrialRecord
) -> NextTrial:
    """A screened configuration again, on a fresh engine and a new arrival order."""
    return NextTrial(
        number=len(records),
        params=candidate.params,
        phase="finalist",
        label=candidate.label,
        seed=spec.tuning.seed + 1,
        of_trial=candidate.number,
    )


def confirm_feasible(
    spec: LLMDeploymentSpec, platform: Platform, records: Sequence[TrialRecord]
) -> NextTrial | Finished | None:
    """`until_confirmed`: the re-measurement of the first feasible screening trial not yet
    re-measured, or the study's end once one held; None while screening goes on."""
    for candidate in (r for r in records if r.phase == "screen" and r.feasible):
        again = _re_measurements(records, candidate)
        if not again:
            if _launched(records) >= spec.tuning.max_trials:
                return None
            return _re_measure(spec, records, candidate)
        if (
            again[-1].measurement is not None
            and not refused(spec, platform, again[-1])
            and _confirmed(candidate, again[-1]).feasible
        ):
            return Finished(
                winner=candidate,
                stopped_because="a configuration was confirmed feasible",
                confirmed=_confirmed(candidate, again[-1]),
            )
    return None


def finalists(
    spec: LLMDeploymentSpec,
    platform: Platform,
    options: TunerOptions,
    records: Sequence[TrialRecord],
) -> list[TrialRecord]:
    """The best feasible configurations, then those unresolved at the target (a second
    start may resolve them); with neither, the ones that carry the most (so that the study
    can say, re-measured, how far the best falls short), equal capacities ranked by how
    near each came to passing the next rate."""
    screened = [r for r in records if r.phase == "screen" and not refused(spec, platform, r)]
    feasible = sorted((r for r in screened if r.feasible), key=lambda r: -r.score)
    unresolved = sorted((r for r in screened if _unresolved(r)), key=lambda r: -r.score)
    if feasible or unresolved:
        return (feasible + unresolved)[: options.finalists]
    carried = [r for r in screened if r.measurement is not None and r.measurement.capacity]
    return sorted(carried, key=lambda r: (-_rate(r), -_near_miss(r)))[: options.finalists]


def plan_finalists(
    spec: LLMDeploymentSpec,
    platform: Platform,
    options: TunerOptions,
    records: Sequence[TrialRecord],
    stopped: str,
) -> NextTrial | Finished:
    """Re-measures the best feasible configurations on a fresh schedule (a new workload
    seed) and a fresh engine. A finalist is confirmed when its capacity over both starts
    (`_confirmed`: their pooled mean and its interval) carries the target. The winner is
    the best confirmed capacity; among the confirmed that the paired verdict cannot tell
    from the best (`capacity.versus`: no meaningful difference), the one with the fewest
    overrides of vLLM's defaults."""
    budget = spec.tuning.max_trials
    confirmed: list[tuple[Capacity, TrialRecord]] = []
    shortfall: list[tuple[Capacity, TrialRecord]] = []  # re-measured, still infeasible
    for candidate in finalists(spec, platform, options, records):
        previous = _re_measurements(records, candidate)
        if previous:
            again = previous[-1]
        elif _launched(records) < budget:
            return _re_measure(spec, records, candidate)
        else:
            again = candidate  # no budget left to re-measure: trust the screening run
        both = _confirmed(candidate, again) if again.measurement is not None else None
        if refused(spec, platform, again):  # its second start failed the quality gate
            continue
        if both is not None and both.feasible:
            confirmed.append((both, candidate))
        elif both is not None:
            shortfall.append((both, candidate))
    if not confirmed:
        if not shortfall:
            return Finished(winner=None, stopped_because=stopped)
        carried, most = max(shortfall, key=lambda pair: pair[0].rate)
        return Finished(
            winner=None,
            stopped_because=stopped,
            confirmed=carried,
            best=most,
            replicas=fewest_replicas(shortfall, _measured_target(records), platform.defaults),
        )
    best, _ = max(confirmed, key=lambda pair: pair[0].rate)
    tied = [pair for pair in confirmed if versus(best, pair[0]).verdict != Difference.BETTER]
    defaults = platform.defaults
    chosen, winner = min(
        tied, key=lambda pair: (overrides(pair[1].params, defaults), -pair[0].rate)
    )
    return Finished(winner=winner, stopped_because=stopped, confirmed=chosen)


def model_start(
    spec: LLMDeploymentSpec,
    platform: Platform,
    space: Space,
    options: TunerOptions,
    records: Sequence[TrialRecord],
) -> list[tuple[str, dict[str, Any]]] | None:
    """The configurations the performance model ranks best, each labelled model-N, to queue
    once vLLM's defaults are measured with the engine's ceilings (None before that); a
    resumed study gets only those it has not run."""
    baseline = next(
        (
            r
            for r in records
            if r.label == "vllm-defaults" and r.phase == "screen" and r.measurement is not None
        ),
        None,
    )
    ceiling = study_ceiling(list(records))
    output = spec.tuning.workload.output_tokens
    if baseline is None or ceiling is None or output is None or spec.slo is None:
        return None
    inputs = perfmodel.Inputs.from_baseline(
        baseline, ceiling, output.mean, platform.defaults["max_num_batched_tokens"]
    )
    suggested = perfmodel.suggest(
        space,
        platform.defaults,
        inputs.costs,
        inputs.shape,
        spec.slo,
        count=options.model_start + 1,  # one may be a configuration already run
        kv_tokens=inputs.kv_tokens,
    )
    done = {r.label for r in records if r.label}
    # Configurations run before the model's turn (the defaults, the current one) are not
    # run again; the model's own, run before a restart, keep their numbers.
    tried = [r.params for r in records if r.launched and not (r.label or "").startswith("model-")]
    fresh = [params for params, _ in suggested if params not in tried]
    return [
        (f"model-{number}", params)
        for number, params in enumerate(fresh[: options.model_start], 1)
        if f"model-{number}" not in done
    ]


class Gate(Protocol):
    """The quality gate of a study that allows lossy settings (`slotune.tuner.gate`)."""

    def after(
        self, label: str | None, settings: dict[str, Any], url: str, measured: Measurement
    ) -> Measurement: ...


class Tuner(Planner):
    """Runs one study on one runtime (`tune --local`, the benchmarks): plans as `Planner`
    does, launches each trial, and keeps every record in `store` as it goes."""

    def __init__(
        self,
        spec: LLMDeploymentSpec,
        *,
        runtime: Runtime,
        measure: Measure,
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
        gate: Gate | None = None,
    ) -> None:
        super().__init__(
            spec,
            platform=platform,
            model=model,
            served_name=served_name,
            records=store.load(),
            options=options,
            storage=storage,
            extra_env=extra_env,
            sampler=sampler,
            space=space,
        )
        self.runtime = runtime
        self.measure = measure
        self.store = store
        self.clock = clock
        self.gate = gate
        """The quality gate, where the study allows lossy settings (`slotune.tuner.gate`)."""

    def record(self, record: TrialRecord) -> None:
        """Keeps a finished trial: in the store, in memory, and in the study."""
        self.store.append(record)
        super().record(record)

    def launch(self, planned: NextTrial, request: MeasureRequest | None = None) -> Launch:
        """Starts, measures and stops one configuration (measured as `request` asks, by
        default as the study asks for this trial)."""
        params = planned.params
        try:
            engine = self.runtime.start(self._config(params), timeout=self.options.startup_timeout)
        except EngineStartError as error:
            failure = error.failure
            return Launch(
                TrialState.FAILED, cause=failure.describe(), failure_kind=str(failure.kind)
            )
        try:
            measurement = self.measure(engine.base_url, request or self.measure_request(planned))
            if self.gate is not None:
                measurement = self.gate.after(
                    planned.label, self.merged(params), engine.base_url, measurement
                )
        finally:
            engine.stop()
        return Launch(TrialState.MEASURED, measurement=measurement, facts=asdict(engine.facts))

    def run_trial(self, planned: NextTrial) -> TrialRecord:
        """Launches one planned trial and keeps its record."""
        began = self.clock()
        launch = self.launch(planned)
        record = self.record_of(planned, launch, self.clock() - began)
        self.record(record)
        return record

    def run(self, progress: Callable[[Progress], None] | None = None) -> StudyResult:
        """Plans and runs trials on the runtime until the study ends."""
        budget = self.spec.tuning.max_trials
        while isinstance(planned := self.plan(), NextTrial):
            record = self.run_trial(planned)
            if progress is not None:
                candidate = next((r for r in self.records if r.number == planned.of_trial), None)
                if planned.phase == "finalist":
                    progress(
                        Progress(record, _launched(self.records), budget, candidate, "re-measured")
                    )
                else:
                    progress(Progress(record, _launched(self.records), budget, self._best()))
        baseline = next(
            (r for r in self.records if r.label == "vllm-defaults" and r.phase == "screen"), None
        )
        return StudyResult(
            records=list(self.records),
            winner=planned.winner,
            baseline=baseline,
            stopped_because=planned.stopped_because,
            space={name: repr(dist) for name, dist in self.space.items()},
            target_rate=_measured_target(self.records),
            ceiling=self.ceiling,
            confirmed=planned.confirmed,
            best=planned.best,
            replicas=planned.replicas,
        )


def _confirmed(first: TrialRecord, again: TrialRecord) -> Capacity:
    """A configuration's capacity over two measurements (`capacity.pool_starts`)."""
    a = first.measurement.capacity if first.measurement else None
    b = again.measurement.capacity if again.measurement else None
    if again is first or a is None or b is None:  # one start: nothing to pool
        found = a or b
        if found is None:
            raise ValueError("a feasible record has a measured capacity")
        return found
    return pool_starts(a, b)


def baseline_capacity(records: Sequence[TrialRecord]) -> Capacity | None:
    """vLLM's defaults' capacity: pooled with their re-measurement where the study made one."""
    baseline = next(
        (r for r in records if r.label == "vllm-defaults" and r.phase == "screen"), None
    )
    if baseline is None or baseline.measurement is None or baseline.measurement.capacity is None:
        return None
    again = [r for r in records if r.phase == "finalist" and r.of_trial == baseline.number]
    return _confirmed(baseline, again[-1]) if again else baseline.measurement.capacity


def versus_defaults(records: Sequence[TrialRecord], confirmed: Capacity) -> Comparison | None:
    """A confirmed capacity against vLLM's defaults: the paired verdict people read."""
    base = baseline_capacity(records)
    if base is None or base.rate <= 0 or confirmed.rate <= 0:
        return None
    return versus(confirmed, base)


def _unresolved(record: TrialRecord) -> bool:
    found = record.measurement.capacity if record.measurement else None
    return found is not None and found.at_target == AtTarget.UNRESOLVED


def _rate(record: TrialRecord) -> float:
    return record.measurement.capacity_rate if record.measurement else 0.0


def _near_miss(record: TrialRecord) -> float:
    found = record.measurement.capacity if record.measurement else None
    return attainment_at_upper(found) if found is not None else 0.0
