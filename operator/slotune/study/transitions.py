"""The tuning study's decisions: a pure transition function over plain data.

`decide(situation, observation)` takes the spec, the study's place in `status.tuning`, what
on-call says now and what the API holds (an `Observation`: the trial records, the trial pod
and load Job, the serving pods), and returns the new `status.tuning`, the actions to take
(apply or delete objects, keep records) and the events to emit. It does no I/O: `observe`
gathers the observation and `act` performs the actions (`slotune.study.step` runs the
three), so every branch below is tested from plain data.

The transitions are read top to bottom: `STUDY` picks what kind of step this is, and a study
with trials in flight goes on by its trial's step (`TRIAL_STEPS`).

A trial (strategy Canary) runs on its own pod, outside the serving Service, and is measured by
a load Job running the operator's image. The study plans its trials with the same planner as
`slotune tune --local`. When it ends, the winner is promoted to the serving Deployment (a
surge rollout: no serving capacity is lost), checked, and rolled back to the last good
configuration if it fails its readiness or SLO check; with `apply: Recommend` it is only
written to status, with a patch of the spec that would make it permanent.

Strategy InPlace (no spare GPU for a canary) rolls the serving Deployment itself to each
trial's configuration and measures it there; the last good configuration comes back after the
study unless a winner is promoted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from slotune import models, render
from slotune.engine.knobs import lossy_settings
from slotune.measure.capacity import Capacity
from slotune.models import (
    ConditionType,
    CurrentTrial,
    LLMDeploymentSpec,
    ReplicaCapacity,
    TunedConfig,
    TuningState,
    TuningStatus,
)
from slotune.status import ConditionRow, Event
from slotune.study import trials
from slotune.tuner.loop import Finished, Launch, NextTrial, Planner, versus_defaults
from slotune.tuner.records import TrialRecord, TrialState, dumps
from slotune.tuner.space import describe_params, platform_for

TERMINAL = {TuningState.COMPLETED, TuningState.RECOMMENDED, TuningState.ROLLED_BACK}


@dataclass(frozen=True)
class Settings:
    """Operator-wide settings for trials (`slotune.settings` reads them from the operator's
    environment)."""

    load_image: str = "slotune/operator:latest"  # the chart sets its own image
    startup_seconds: float = 960.0  # a trial engine not ready by then has failed


@dataclass(frozen=True)
class Live:
    """What on-call monitoring says right now, as far as the study cares."""

    hold: bool = False  # Prometheus is configured but unreachable: change nothing
    throttled: bool = False  # GPUs run below their maximum clock: measurements not trusted
    retune: str | None = None  # why a new study is due, if one is
    slo_met: bool | None = None
    slo_measured_at: datetime | None = None
    slo_detail: str = ""
    workload: models.WorkloadSpec | None = None  # traffic's shape, for a Live workload


@dataclass(frozen=True)
class Situation:
    """Everything a step decides from, except what the API holds."""

    owner: render.Owner
    spec: LLMDeploymentSpec
    previous: TuningStatus | None
    now: datetime
    active_hash: str  # config hash the serving Deployment's template runs
    serving_ready: bool  # every replica of that template is ready
    live: Live = field(default_factory=Live)
    settings: Settings = field(default_factory=Settings)


@dataclass(frozen=True)
class Quarantine:
    """Record lines that did not load: all of them as kept (`kept`, JSON lines), and why each
    one found in the records this step did not (`new`)."""

    kept: str = ""
    new: list[str] = field(default_factory=list)


class Observation(Protocol):
    """What the API holds that a step may look at; each read is made at most once a step
    (`slotune.study.observe.KubeObservation`), or given as plain data in tests."""

    def records(self, study: int) -> list[TrialRecord]:
        """The trial records kept for `study` (none when the kept ones are another study's)."""

    def quarantine(self, study: int) -> Quarantine:
        """The record lines of `study` that did not load."""

    def trial_objects(self) -> list[dict[str, Any]]:
        """The owner's trial pods and load Jobs, deleting ones included."""

    def trial_pod(self, name: str) -> dict[str, Any] | None: ...

    def trial_policy(self, name: str) -> dict[str, Any] | None:
        """The NetworkPolicy at the trial's name, whoever made it."""

    def load_job(self, name: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The load Job and its pods."""

    def serving_pods(self, config_hash: str) -> list[dict[str, Any]]:
        """The serving pods whose template runs `config_hash`."""


@dataclass(frozen=True)
class Apply:
    """Server-side apply of an object."""

    obj: dict[str, Any]


@dataclass(frozen=True)
class Delete:
    """Delete an object (gone already is fine)."""

    api_version: str
    kind: str
    namespace: str
    name: str


Action = Apply | Delete


@dataclass
class Decision:
    tuning: TuningStatus | None
    overlay: dict[str, Any]  # tuned params laid over the spec on the serving Deployment
    row: ConditionRow | None  # the Tuning condition
    events: list[Event] = field(default_factory=list)
    progressed: bool = False  # another step can be taken right away
    actions: list[Action] = field(default_factory=list)  # in order


def serving_overlay(tuning: TuningStatus | None, strategy: str = "Canary") -> dict[str, Any]:
    """The tuned params the serving Deployment runs: the promoted ones, or with strategy
    InPlace the trial's own while one is deployed."""
    if tuning is None:
        return {}
    current = tuning.current
    if (
        strategy == "InPlace"
        and tuning.state == TuningState.TUNING
        and current is not None
        and current.step != "CleaningUp"
    ):
        return dict(current.params)
    return dict(tuning.promoted.params) if tuning.promoted else {}


def _row(tuning: TuningStatus) -> ConditionRow:
    message = tuning.message or ""
    if tuning.state == TuningState.TUNING:
        return (ConditionType.TUNING, "True", "TrialsRunning", message)
    if tuning.state == TuningState.PROMOTING:
        return (ConditionType.TUNING, "True", "Promoting", message)
    reason = str(tuning.state or "NotStarted")
    return (ConditionType.TUNING, "False", reason, message)


def _tuning_off(study: StudyStep) -> bool:
    return not study.spec.tuning.enabled or study.spec.slo is None


def _held(study: StudyStep) -> bool:
    return study.situation.live.hold


def _new_study_due(study: StudyStep) -> bool:
    previous = study.situation.previous
    return previous is None or previous.spec_hash != trials.spec_hash(study.spec)


def _ended(study: StudyStep) -> bool:
    return study.tuning.state in TERMINAL


def _promoting(study: StudyStep) -> bool:
    return study.tuning.state == TuningState.PROMOTING


def _always(study: StudyStep) -> bool:
    return True


@dataclass(frozen=True)
class Transition:
    """When `guard` holds (the first one, in table order), `then` decides the step."""

    when: str
    guard: Callable[[StudyStep], bool]
    then: Callable[[StudyStep], Decision]


# What kind of step this is. Order carries meaning: a hold beats a spec change (no new study
# starts while Prometheus, which it would be judged by, is unreachable), and a spec change
# beats everything a study in progress would do.
STUDY: tuple[Transition, ...] = (
    Transition("tuning is off, or the spec has no SLO", _tuning_off, lambda s: s.disabled()),
    Transition("Prometheus is unreachable", _held, lambda s: s.hold()),
    Transition("no study yet, or the spec changed", _new_study_due, lambda s: s.start_new()),
    Transition("the study ended", _ended, lambda s: s.after_study()),
    Transition("a winner is being promoted", _promoting, lambda s: s.verify()),
    Transition("trials are under way", _always, lambda s: s.advance()),
)


class StudyStep:
    """One step's decision for an LLMDeployment's study, built from plain data."""

    def __init__(self, situation: Situation, observation: Observation) -> None:
        self.situation = situation
        self.spec = situation.spec
        self.owner = situation.owner
        self.now = situation.now
        self.seen = observation
        self.events: list[Event] = []
        self.actions: list[Action] = []
        self._deleted: set[tuple[str, str]] = set()
        self._quarantined: set[int] = set()  # studies whose unreadable records were moved
        previous = situation.previous
        self.tuning = (
            previous.model_copy(deep=True, update={"max_trials": self.spec.tuning.max_trials})
            if previous is not None
            else TuningStatus()
        )

    def decide(self) -> Decision:
        transition = next(t for t in STUDY if t.guard(self))
        return transition.then(self)

    def start_new(self) -> Decision:
        previous = self.situation.previous
        reason = "Created" if previous is None else "SpecChanged"
        return self._start(previous, trials.spec_hash(self.spec), reason, keep_overlay=False)

    def disabled(self) -> Decision:
        return self._disabled(self.situation.previous)

    def hold(self) -> Decision:
        return self._held(self.situation.previous)

    def after_study(self) -> Decision:
        return self._after_study(self.tuning)

    def verify(self) -> Decision:
        return self._verify(self.tuning)

    def advance(self) -> Decision:
        return self._advance(self.tuning)

    def _disabled(self, previous: TuningStatus | None) -> Decision:
        """Tuning off: the spec's own configuration serves and trial objects go."""
        if previous is None:  # never tuned: there is nothing to clean up
            return Decision(None, {}, None)
        self._delete_trial_objects(keep=None)
        tuning = previous.model_copy(update={"promoted": None, "current": None})
        if previous.promoted is not None:
            tuning.message = "tuning is disabled: the spec's own configuration serves"
        row: ConditionRow = (ConditionType.TUNING, "False", "Disabled", tuning.message or "")
        return Decision(tuning, {}, row, actions=self.actions)

    def _held(self, previous: TuningStatus | None) -> Decision:
        """Prometheus is unreachable: nothing changes until it answers again."""
        active = previous is not None and previous.state in (
            TuningState.TUNING,
            TuningState.PROMOTING,
        )
        row: ConditionRow = (
            ConditionType.TUNING,
            "True" if active else "False",
            "Held",
            "Prometheus is unreachable: holding still until it answers again",
        )
        return Decision(previous, serving_overlay(previous, self.spec.tuning.strategy), row)

    def _result(self, tuning: TuningStatus, *, progressed: bool = False) -> Decision:
        overlay = serving_overlay(tuning, self.spec.tuning.strategy)
        row = _row(tuning)
        if tuning.state == TuningState.TUNING and tuning.study:
            # Record lines moved aside stay in the condition until a person clears them.
            kept = self.seen.quarantine(tuning.study).kept
            if kept:
                name = render.child_name(self.owner, "trials")
                row = (
                    *row[:3],
                    f"{row[3]}; {len(kept.splitlines())} trial record line(s) that did not load "
                    f"are kept in ConfigMap {name}, key {render.QUARANTINE_KEY}",
                )
        return Decision(tuning, overlay, row, self.events, progressed, self.actions)

    # -- studies -------------------------------------------------------------------------------

    def _start(
        self, previous: TuningStatus | None, wanted: str, reason: str, *, keep_overlay: bool
    ) -> Decision:
        number = (previous.study if previous else 0) + 1
        tuning = TuningStatus(
            state=TuningState.TUNING,
            study=number,
            reason=reason,
            spec_hash=wanted,
            started_at=self.now,
            max_trials=self.spec.tuning.max_trials,
            message=f"study {number} started ({reason})",
            promoted=previous.promoted if previous and keep_overlay else None,
        )
        self._delete_trial_objects(keep=None)
        self._save_records(number, [])
        self.events.append(Event("Normal", "TuningStarted", f"Study {number} started: {reason}"))
        return self._result(tuning, progressed=True)

    def _after_study(self, tuning: TuningStatus) -> Decision:
        # No trial object outlives a study: each went when its trial was recorded, and the
        # study only ends once no trial is in flight. Nothing to list on every resync here.
        live = self.situation.live
        if (
            tuning.state == TuningState.RECOMMENDED
            and self.spec.tuning.apply == "Auto"
            and tuning.recommendation is not None
        ):
            winner = self._records(tuning.study)
            chosen = next(
                (r for r in winner if r.number == tuning.recommendation.get("trial")), None
            )
            # A recommendation of several replicas is whole only where slotune sizes them.
            whole = "replicas" not in tuning.recommendation or self.spec.scaling.mode == "Capacity"
            if chosen is not None and whole:
                return self._promote(tuning, chosen)
        if live.retune is not None:
            wanted = tuning.spec_hash or trials.spec_hash(self.spec)
            return self._start(tuning, wanted, live.retune, keep_overlay=True)
        return self._result(tuning)

    def _planner(self, records: list[TrialRecord]) -> Planner:
        """The study's planner, rebuilt from its records; the serving configuration is its
        'current' seed."""
        spec = (
            render.with_params(self.spec, self.situation.previous.promoted.params)
            if (self.situation.previous and self.situation.previous.promoted)
            else self.spec
        )
        return Planner(
            spec,
            platform=platform_for(self.spec),
            model=render.model_path(self.spec),
            served_name=render.served_name(self.owner, self.spec),
            records=records,
        )

    # -- trials --------------------------------------------------------------------------------

    def _advance(self, tuning: TuningStatus) -> Decision:
        """A study with trials: every trial object but the current trial's goes, then the
        current trial's step decides (`TRIAL_STEPS`)."""
        records = self._records(tuning.study)
        tuning = trials.summarize(records, tuning)
        current = tuning.current
        self._delete_trial_objects(
            keep=None if current is None or current.step == "CleaningUp" else current.number,
            study=tuning.study,
        )
        if current is None:
            return self._plan(tuning, records)
        return TRIAL_STEPS[current.step](self, tuning, current, records)

    def _cleaning_up(
        self, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
    ) -> Decision:
        """The trial is recorded; the next is planned once its objects are gone."""
        if self._trial_objects_left(tuning.study, current.number):
            # Deleted by this step (look again at once), or still terminating (wait).
            deleted = any(isinstance(action, Delete) for action in self.actions)
            return self._result(tuning, progressed=deleted)
        tuning.current = None
        return self._result(tuning, progressed=True)

    def _plan(self, tuning: TuningStatus, records: list[TrialRecord]) -> Decision:
        planner = self._planner(records)
        planned = planner.plan()
        if planner.rejected:  # configurations that break the engine's rules: never launched
            records = [*records, *planner.rejected]
            self._save_records(tuning.study, records)
            tuning = trials.summarize(records, tuning)
        if isinstance(planned, Finished):
            return self._finish(tuning, planned, records)
        workload = self._workload()
        if workload is None:
            tuning.message = "waiting for live traffic to shape the trial workload"
            return self._result(tuning)
        tuned = render.with_params(self.spec, planned.params)
        tuning.current = CurrentTrial(
            number=planned.number,
            phase=planned.phase,
            label=planned.label,
            params=planned.params,
            seed=planned.seed,
            of_trial=planned.of_trial,
            step="Launching",
            since=self.now,
            started_at=self.now,
            config_hash=render.config_hash(self.owner, tuned),
        )
        what = "re-measuring" if planned.phase == "finalist" else "trying"
        tuning.message = f"trial {planned.number}: {what} {_describe(planned.params)}"
        return self._result(tuning, progressed=True)

    def _workload(self) -> models.WorkloadSpec | None:
        workload = self.spec.tuning.workload
        if workload.source == "Synthetic":
            return workload
        return self.situation.live.workload

    def _launching(
        self, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
    ) -> Decision:
        if self.spec.tuning.strategy == "InPlace":
            return self._launching_in_place(tuning, current, records)
        name = render.child_name(self.owner, "trial", tuning.study, current.number)
        pod = self.seen.trial_pod(name)
        if pod is None:
            policy = self.seen.trial_policy(name)
            if policy is not None and not trials.controlled_by(policy, self.owner.uid):
                # Applied, it would take the fields of someone else's policy over.
                detail = trials.not_ours({"kind": "NetworkPolicy", **policy})
                return self._conflict(tuning, current, detail)
            # The policy first: the engine is never reachable by any pod but its load Job's.
            self.actions.append(
                Apply(
                    render.render_trial_network_policy(
                        self.owner, self.spec, tuning.study, current.number
                    )
                )
            )
            self.actions.append(
                Apply(
                    render.render_trial_pod(
                        self.owner, self.spec, current.params, tuning.study, current.number
                    )
                )
            )
            current.pod = name
            return self._result(tuning)
        waited = (self.now - current.since).total_seconds()
        state = trials.PodState.of(
            pod, startup_seconds=waited, owner_uid=self.owner.uid, made=current.pod_uid
        )
        if state.phase == "Conflict":
            return self._conflict(tuning, current, state.detail)
        current.pod_uid = current.pod_uid or pod["metadata"].get("uid")
        if state.phase == "Ready" and state.ip:
            return self._start_load(tuning, current, records, f"http://{state.ip}:{self._port}")
        if state.phase == "Failed":
            return self._record(
                tuning,
                current,
                records,
                Launch(TrialState.FAILED, cause=state.detail, failure_kind=state.failure_kind),
            )
        if state.phase == "Blocked":
            current.note = state.detail
            if state.detail.startswith("Unschedulable"):
                current.note += " (no room for a canary: strategy InPlace tunes without one)"
                return self._result(tuning)
        if waited > self.situation.settings.startup_seconds:
            cause = f"the engine was not ready after {waited:.0f} s"
            if current.note:
                cause += f" ({current.note})"
            return self._record(
                tuning,
                current,
                records,
                Launch(TrialState.FAILED, cause=cause, failure_kind="Timeout"),
            )
        return self._result(tuning)

    def _voided(
        self, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord], detail: str
    ) -> Decision:
        """The load Job completed through a pod it did not make: deleted, and the trial
        measured again by a new one; a trial whose Jobs keep doing so is recorded as failed."""
        if current.voided >= MAX_VOIDED:  # not a forgery now and then: this cluster's way
            cause = (
                f"{detail}, {current.voided + 1} times: a webhook that changes the load "
                "pod (its image, arguments, environment or mounts) would do that"
            )
            return self._record(
                tuning,
                current,
                records,
                Launch(TrialState.FAILED, cause=cause, failure_kind="LoadFailed"),
            )
        self._delete(
            Delete(
                "batch/v1",
                "Job",
                self.owner.namespace,
                render.child_name(self.owner, "load", tuning.study, current.number),
            )
        )
        if current.note != detail:
            current.voided += 1
            self.events.append(
                Event(
                    "Warning",
                    "TrialDiscarded",
                    f"Trial {current.number}: measurement discarded, {detail}",
                )
            )
        current.note = detail
        return self._result(tuning)  # once it is gone, the trial is measured again

    def _conflict(self, tuning: TuningStatus, current: CurrentTrial, detail: str) -> Decision:
        """Someone else's object sits at the trial's name: the trial waits, and says so. It is
        never adopted, read or deleted; once it is gone the trial goes on."""
        if current.note != detail:
            self.events.append(
                Event("Warning", "ChildConflict", f"Trial {current.number}: {detail}")
            )
        current.note = detail
        decision = self._result(tuning)
        decision.row = (
            ConditionType.TUNING,
            "True",
            "ChildConflict",
            f"trial {current.number}: {detail}",
        )
        return decision

    def _launching_in_place(
        self, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
    ) -> Decision:
        """The serving Deployment runs the trial (the overlay below); wait for its rollout."""
        waited = (self.now - current.since).total_seconds()
        pods = self._serving_pods(current.config_hash)
        failure = _first_failure(pods)
        if failure:
            return self._record(
                tuning,
                current,
                records,
                Launch(TrialState.FAILED, cause=failure, failure_kind="Crash"),
            )
        if self.situation.active_hash == current.config_hash and self.situation.serving_ready:
            states = [trials.PodState.of(pod) for pod in pods]
            ip = next((state.ip for state in states if state.phase == "Ready"), None)
            if ip:
                return self._start_load(tuning, current, records, f"http://{ip}:{self._port}")
        if waited > self.situation.settings.startup_seconds:
            return self._record(
                tuning,
                current,
                records,
                Launch(
                    TrialState.FAILED,
                    cause=f"the rollout was not ready after {waited:.0f} s",
                    failure_kind="Timeout",
                ),
            )
        return self._result(tuning)

    @property
    def _port(self) -> int:
        """The port the trial's engine serves on."""
        return render.engine_of(self.spec).port

    def _start_load(
        self, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord], url: str
    ) -> Decision:
        workload = self._workload()
        if workload is None or workload.request_rate is None:
            current.note = "waiting for live traffic to shape the trial workload"
            return self._result(tuning)
        name = render.child_name(self.owner, "load", tuning.study, current.number)
        existing, _ = self.seen.load_job(name)
        if existing is not None and not trials.controlled_by(existing, self.owner.uid):
            return self._conflict(tuning, current, trials.not_ours({"kind": "Job", **existing}))
        planner = self._planner(records)
        request = planner.measure_request(_planned(current), rate=workload.request_rate)
        tuning.target_rate = round(request.target_rate, 4)
        knobs = render.engine_of(self.spec).knobs
        gated = self.spec.tuning.quality.allow_lossy and bool(
            lossy_settings(knobs, planner.merged(current.params))
        )
        # The reference is the serving pods, where they are lossless and not the trial itself.
        serving = planner.merged(serving_overlay(tuning, self.spec.tuning.strategy))
        reference = self.spec.tuning.strategy == "Canary" and not lossy_settings(knobs, serving)
        job = render.render_load_job(
            self.owner,
            self.spec,
            image=self.situation.settings.load_image,
            url=url,
            workload=workload,
            request=request,
            study=tuning.study,
            trial=current.number,
            gated=gated,
            reference_url=render.service_url(self.owner, self.spec) if reference else None,
        )
        self.actions.append(Apply(job))
        current.job = job["metadata"]["name"]
        current.job_uid = None  # a new Job: its UID comes with the apply (`slotune.study.step`)
        current.step = "Measuring"
        current.since = self.now
        current.note = None
        return self._result(tuning)

    def _measuring(
        self, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
    ) -> Decision:
        ns = self.owner.namespace
        if self.spec.tuning.strategy == "Canary":
            pod_name = render.child_name(self.owner, "trial", tuning.study, current.number)
            engine = trials.PodState.of(
                self.seen.trial_pod(pod_name), owner_uid=self.owner.uid, made=current.pod_uid
            )
            if engine.phase == "Conflict":
                return self._conflict(tuning, current, engine.detail)
            if engine.phase in ("Failed", "Gone"):
                cause = "the engine stopped while it was measured"
                if engine.detail:
                    cause += f": {engine.detail}"
                return self._record(
                    tuning,
                    current,
                    records,
                    Launch(
                        TrialState.FAILED, cause=cause, failure_kind=engine.failure_kind or "Crash"
                    ),
                )
        elif failure := _first_failure(self._serving_pods(current.config_hash)):
            return self._record(
                tuning,
                current,
                records,
                Launch(TrialState.FAILED, cause=failure, failure_kind="Crash"),
            )
        job_name = render.child_name(self.owner, "load", tuning.study, current.number)
        job, pods = self.seen.load_job(job_name)
        load = trials.LoadState.of(job, pods, owner_uid=self.owner.uid, made=current.job_uid)
        if load.phase == "Conflict":
            return self._conflict(tuning, current, load.detail)
        if job is not None and load.phase != "Gone":
            current.job_uid = current.job_uid or job["metadata"].get("uid")
        if load.phase == "Void":
            return self._voided(tuning, current, records, load.detail)
        if load.phase == "Gone":
            current.step = "Launching"  # measured again, once the engine is (still) ready
            return self._result(tuning, progressed=True)
        if load.phase == "Failed":
            return self._record(
                tuning,
                current,
                records,
                Launch(TrialState.FAILED, cause=load.detail, failure_kind="LoadFailed"),
            )
        if load.phase == "Done":
            if self.situation.live.throttled:
                # A throttled GPU measures slower than it serves: not trusted, measured again.
                self._delete(Delete("batch/v1", "Job", ns, job_name))
                current.note = "measurement discarded: the GPUs were throttled"
                self.events.append(
                    Event(
                        "Warning",
                        "TrialDiscarded",
                        f"Trial {current.number}: measurement discarded, the GPUs were throttled",
                    )
                )
                return self._result(tuning)
            return self._record(
                tuning, current, records, Launch(TrialState.MEASURED, measurement=load.measurement)
            )
        return self._result(tuning)

    def _record(
        self,
        tuning: TuningStatus,
        current: CurrentTrial,
        records: list[TrialRecord],
        launch: Launch,
    ) -> Decision:
        """Keeps the trial's record (once, whatever restarts happen) and cleans up after it."""
        if not any(r.number == current.number for r in records):
            planned = _planned(current)
            seconds = (self.now - current.started_at).total_seconds()
            record = self._planner(records).record_of(planned, launch, seconds)
            records = [*records, record]
            self._save_records(tuning.study, records)
            self.events.append(_trial_event(record))
        tuning = trials.summarize(records, tuning)
        current.step = "CleaningUp"
        current.since = self.now
        tuning.current = current
        self._delete_trial_objects(keep=None, study=tuning.study)
        return self._result(tuning, progressed=True)

    # -- the end of a study ----------------------------------------------------------------

    def _finish(
        self, tuning: TuningStatus, finished: Finished, records: list[TrialRecord]
    ) -> Decision:
        tuning.finished_at = self.now
        winner = finished.winner
        done = f"{tuning.trials_completed} trials ({finished.stopped_because})"
        found = (
            versus_defaults(records, finished.confirmed)
            if winner is not None
            and finished.confirmed is not None
            and winner.label != "vllm-defaults"
            else None
        )
        tuning.versus_defaults = found.describe() if found is not None else None
        if winner is not None and finished.confirmed is not None:
            tuning.replica_capacity = self._replica_capacity(tuning, winner, finished.confirmed)
        if winner is None:
            return self._no_winner(tuning, finished, done)
        if self.spec.tuning.apply == "Recommend":
            tuning.state = TuningState.RECOMMENDED
            tuning.recommendation = trials.recommendation(self.spec, winner, self.now)
            tuning.message = (
                f"recommends trial {winner.number} ({_describe(winner.params)}) after {done}; "
                "apply the patch in status.tuning.recommendation or set apply: Auto"
            )
            self.events.append(Event("Normal", "Recommended", tuning.message))
            return self._result(tuning)
        return self._promote(tuning, winner, done=done)

    def _no_winner(self, tuning: TuningStatus, finished: Finished, done: str) -> Decision:
        """No configuration carries the target on one replica. When the best one was
        re-measured, N replicas of it do: Recommend says so with a patch; Auto promotes it when
        Capacity scaling sizes the replicas; otherwise serving stays as it is."""
        tuning.state = TuningState.COMPLETED
        tuning.message = f"no configuration met the SLO on one replica in {done}"
        replicas = finished.replicas
        if replicas is None or finished.best is None or finished.confirmed is None:
            tuning.message += "; serving is unchanged"
            self.events.append(Event("Warning", "NoConfigurationMetSLO", tuning.message))
            return self._result(tuning)
        best = replicas.record
        tuning.replica_capacity = self._replica_capacity(tuning, best, replicas.capacity)
        gpus = replicas.count * self.spec.resources.gpus
        tuning.message += (
            f"; the most any carries is {finished.confirmed.describe()} (trial "
            f"{finished.best.number}); {replicas.count} replicas ({gpus} GPUs) of trial "
            f"{best.number} ({_describe(best.params)}, {replicas.capacity.rate:.3g} req/s each) "
            f"carry {tuning.target_rate or 0:.3g} req/s"
        )
        tuning.recommendation = trials.recommendation(
            self.spec, best, self.now, replicas=replicas.count
        )
        if self.spec.tuning.apply == "Auto" and self.spec.scaling.mode == "Capacity":
            self.events.append(Event("Warning", "NoConfigurationMetSLO", tuning.message))
            return self._promote(tuning, best, done=done)
        if self.spec.tuning.apply == "Recommend":
            tuning.state = TuningState.RECOMMENDED
            tuning.message += "; apply the patch in status.tuning.recommendation"
        else:
            tuning.message += (
                "; serving is unchanged: set scaling.mode: Capacity to let slotune size the "
                "replicas, or apply the patch in status.tuning.recommendation"
            )
        self.events.append(Event("Warning", "NoConfigurationMetSLO", tuning.message))
        return self._result(tuning)

    def _replica_capacity(
        self, tuning: TuningStatus, record: TrialRecord, confirmed: Capacity
    ) -> ReplicaCapacity:
        low, high = confirmed.interval
        return ReplicaCapacity(
            hash=render.config_hash(self.owner, render.with_params(self.spec, record.params)),
            trial=record.number,
            study=tuning.study,
            rate=round(confirmed.rate, 4),
            low=round(low, 4),
            high=round(high, 4) if high is not None else None,
        )

    def _promote(self, tuning: TuningStatus, winner: TrialRecord, *, done: str = "") -> Decision:
        serving_now = render.config_hash(
            self.owner, render.with_params(self.spec, serving_overlay(tuning))
        )
        target = render.config_hash(self.owner, render.with_params(self.spec, winner.params))
        if target == serving_now:
            tuning.state = TuningState.COMPLETED
            tuning.message = (
                f"the serving configuration is already the best (trial {winner.number})"
                + (f" after {done}" if done else "")
            )
            return self._result(tuning)
        tuning.last_good = tuning.promoted or TunedConfig(params={}, hash=serving_now, at=self.now)
        tuning.promoted = TunedConfig(
            params=winner.params, trial=winner.number, study=tuning.study, hash=target, at=self.now
        )
        tuning.state = TuningState.PROMOTING
        tuning.verify_since = None
        tuning.message = f"promoting trial {winner.number} ({_describe(winner.params)})"
        self.events.append(Event("Normal", "Promoting", tuning.message.capitalize()))
        return self._result(tuning, progressed=True)

    def _verify(self, tuning: TuningStatus) -> Decision:
        """The promoted configuration must become ready, then hold the SLO over one window."""
        promoted = tuning.promoted
        if promoted is None or promoted.at is None:  # nothing to check (status edited by hand)
            tuning.state = TuningState.COMPLETED
            return self._result(tuning)
        if failure := _first_failure(self._serving_pods(promoted.hash)):
            return self._roll_back(tuning, f"its pods failed: {failure}")
        waited = (self.now - promoted.at).total_seconds()
        rolled = self.situation.active_hash == promoted.hash and self.situation.serving_ready
        if not rolled:
            if waited > self.situation.settings.startup_seconds:
                return self._roll_back(tuning, f"it was not ready after {waited:.0f} s")
            return self._result(tuning)
        if tuning.verify_since is None:
            tuning.verify_since = self.now
        window = timedelta(seconds=models.seconds(self.spec.slo.window if self.spec.slo else "5m"))
        live = self.situation.live
        judged = (
            live.slo_measured_at is not None
            and live.slo_measured_at >= tuning.verify_since + window
        )
        if judged and live.slo_met is False:
            return self._roll_back(tuning, f"it missed the SLO: {live.slo_detail}")
        if judged or self.now >= tuning.verify_since + window:
            verdict = (
                "met the SLO on live traffic"
                if judged and live.slo_met
                else ("ready; the SLO had no live traffic to judge")
            )
            tuning.state = TuningState.COMPLETED
            tuning.message = f"promoted trial {promoted.trial}: {verdict}"
            self.events.append(Event("Normal", "Promoted", tuning.message.capitalize()))
            return self._result(tuning)
        tuning.message = f"promoted trial {promoted.trial} is ready; checking the SLO"
        return self._result(tuning)

    def _roll_back(self, tuning: TuningStatus, why: str) -> Decision:
        promoted = tuning.promoted or TunedConfig()
        tuning.promoted = tuning.last_good if tuning.last_good and tuning.last_good.params else None
        tuning.last_good = None
        tuning.state = TuningState.ROLLED_BACK
        tuning.message = (
            f"rolled back: promoted trial {promoted.trial} ({_describe(promoted.params)}) "
            f"failed its check, {why}"
        )
        self.events.append(Event("Warning", "RolledBack", tuning.message.capitalize()))
        return self._result(tuning, progressed=True)

    # -- objects ---------------------------------------------------------------------------

    def _records(self, study: int) -> list[TrialRecord]:
        records = self.seen.records(study)
        quarantine = self.seen.quarantine(study)
        if quarantine.new and study not in self._quarantined:
            # Moved aside at once, as they were, so that the study and the serving go on.
            self._quarantined.add(study)
            name = render.child_name(self.owner, "trials")
            self.events.append(
                Event(
                    "Warning",
                    "RecordsQuarantined",
                    f"{len(quarantine.new)} trial record(s) of study {study} in ConfigMap {name} "
                    f"did not load and were moved to its {render.QUARANTINE_KEY} key; the study "
                    f"goes on without them ({'; '.join(quarantine.new)[:600]})",
                )
            )
            self._save_records(study, records)
        return records

    def _save_records(self, study: int, records: list[TrialRecord]) -> None:
        kept = self.seen.quarantine(study).kept
        self.actions.append(Apply(render.render_records(self.owner, study, dumps(records), kept)))

    def _delete(self, action: Delete) -> None:
        self._deleted.add((action.kind, action.name))
        self.actions.append(action)

    def _delete_trial_objects(self, *, keep: int | None, study: int | None = None) -> None:
        """Deletes trial pods and load Jobs, except those of the trial `keep` of `study`."""
        for obj in self.seen.trial_objects():
            meta = obj["metadata"]
            labels = meta.get("labels") or {}
            mine = (
                keep is not None
                and labels.get(render.LABEL_STUDY) == str(study)
                and labels.get(render.LABEL_TRIAL) == str(keep)
            )
            if (
                mine
                or not trials.controlled_by(obj, self.owner.uid)  # never someone else's
                or meta.get("deletionTimestamp")
                or (obj["kind"], meta["name"]) in self._deleted
            ):
                continue
            self._delete(Delete(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]))

    def _trial_objects_left(self, study: int, trial: int) -> bool:
        """Whether the trial's pod or load Job is still there (deleting, or deleted by this
        step: the next step looks again)."""
        pod = self.seen.trial_pod(render.child_name(self.owner, "trial", study, trial))
        job, _ = self.seen.load_job(render.child_name(self.owner, "load", study, trial))
        return any(
            obj is not None and trials.controlled_by(obj, self.owner.uid) for obj in (pod, job)
        )

    def _serving_pods(self, config_hash: str) -> list[dict[str, Any]]:
        return self.seen.serving_pods(config_hash)


MAX_VOIDED = 2
"""Load Jobs of one trial discarded (completed through a pod they did not make) before the trial
is recorded as failed rather than measured again."""

TrialStep = Callable[[StudyStep, TuningStatus, CurrentTrial, list[TrialRecord]], Decision]

# A trial in flight goes on by its step: Launching (its engine starts), Measuring (its load Job
# runs), CleaningUp (recorded; its objects go). A study with no trial in flight plans the next.
TRIAL_STEPS: dict[str, TrialStep] = {
    "Launching": StudyStep._launching,
    "Measuring": StudyStep._measuring,
    "CleaningUp": StudyStep._cleaning_up,
}


def _first_failure(pods: list[dict[str, Any]]) -> str | None:
    return next((failure for pod in pods if (failure := _serving_failure(pod))), None)


def _serving_failure(pod: dict[str, Any]) -> str | None:
    """Why a serving pod of a new configuration is failing, if it is."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        now = (container.get("state") or {}).get("terminated") or {}
        ended = now or last
        if (
            container.get("restartCount", 0) > 0
            or ended
            or waiting.get("reason") == "CrashLoopBackOff"
        ):
            state = trials.terminated_failure(ended) if ended else None
            detail = state.detail if state else waiting.get("message", "")
            restarts = container.get("restartCount", 0)
            return f"{pod['metadata']['name']} failed (restarts: {restarts}): {detail}"
    return None


def _planned(current: CurrentTrial) -> NextTrial:
    """The planned trial a trial in flight was started as."""
    return NextTrial(
        number=current.number,
        params=current.params,
        seed=current.seed,
        phase=current.phase,
        label=current.label,
        of_trial=current.of_trial,
    )


def _describe(params: dict[str, Any]) -> str:
    return describe_params(dict(sorted(params.items()))) or "the spec's settings"


def _trial_event(record: TrialRecord) -> Event:
    m = record.measurement
    if m is None:
        return Event(
            "Warning" if record.state == TrialState.FAILED else "Normal",
            f"Trial{record.state}",
            f"Trial {record.number} ({_describe(record.params)}): {record.state}: "
            + (record.cause or "")[:400],
        )
    figures = ", ".join(
        f"{name} p-target {value * 1000:.0f} ms"
        for name, value in m.slo_percentiles.items()
        if value is not None
    )
    c = m.capacity
    if c is None:
        capacity = "no capacity measured"
    else:
        capacity = f"capacity {c.describe()} against {c.target_rate:.3g} needed"
    verdict = f"is {c.verdict}" if c is not None else "is infeasible"
    return Event(
        "Normal",
        "TrialMeasured",
        f"Trial {record.number} ({_describe(record.params)}) {verdict}: {capacity}; at the "
        f"target rate {figures}",
    )


def decide(situation: Situation, observation: Observation) -> Decision:
    """One step of the LLMDeployment's study; see the module docstring."""
    return StudyStep(situation, observation).decide()
