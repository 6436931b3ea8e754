"""What one study step decides from and what it builds up: the plain data in (`Situation`,
`Observation`), the `Decision` out, and the `StepContext` that the rows of
`slotune.study.transitions` take, holding the status being decided, the events and actions so
far, and the bookkeeping every row shares (records kept, trial objects deleted).

Pure, like the rows: the observation is read, never written; actions are only listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Protocol

from slotune import models, render
from slotune.models import ConditionType, LLMDeploymentSpec, TuningState, TuningStatus
from slotune.status import ConditionRow, Event
from slotune.study import trials
from slotune.tuner.records import TrialRecord, dumps
from slotune.tuner.space import Platform, describe_params, platform_for


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
    why: str = ""  # the `when` of each table row that chose this step, for the log


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


def condition_row(tuning: TuningStatus, why: str) -> ConditionRow:
    """The Tuning condition; with no message in status, the rows' `why` says what happens."""
    message = tuning.message or why
    if tuning.state == TuningState.TUNING:
        return (ConditionType.TUNING, "True", "TrialsRunning", message)
    if tuning.state == TuningState.PROMOTING:
        return (ConditionType.TUNING, "True", "Promoting", message)
    reason = str(tuning.state or "NotStarted")
    return (ConditionType.TUNING, "False", reason, message)


def describe(params: dict[str, Any]) -> str:
    return describe_params(dict(sorted(params.items()))) or "the spec's settings"


@dataclass
class StepContext:
    """One step's state: the status being decided (`tuning`, a copy of the previous one), the
    events and actions so far, and the bookkeeping the rows share. Rows change `tuning` and
    add events and actions; `result` turns that into the step's `Decision`."""

    situation: Situation
    seen: Observation
    tuning: TuningStatus
    events: list[Event] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    whens: list[str] = field(default_factory=list)  # the rows chosen, in table order
    deleted: set[tuple[str, str]] = field(default_factory=set)
    quarantined: set[int] = field(default_factory=set)  # studies whose bad lines were moved

    @classmethod
    def of(cls, situation: Situation, observation: Observation) -> StepContext:
        previous = situation.previous
        tuning = (
            previous.model_copy(deep=True, update={"max_trials": situation.spec.tuning.max_trials})
            if previous is not None
            else TuningStatus()
        )
        return cls(situation, observation, tuning)

    @property
    def spec(self) -> LLMDeploymentSpec:
        return self.situation.spec

    @property
    def owner(self) -> render.Owner:
        return self.situation.owner

    @property
    def now(self) -> datetime:
        return self.situation.now

    @property
    def why(self) -> str:
        return "; ".join(self.whens)

    @cached_property
    def seed_spec(self) -> LLMDeploymentSpec:
        """The spec the study plans and scores from: the serving configuration (the promoted
        params over the spec) is its 'current' seed."""
        previous = self.situation.previous
        if previous is not None and previous.promoted is not None:
            return render.with_params(self.spec, previous.promoted.params)
        return self.spec

    @cached_property
    def platform(self) -> Platform:
        return platform_for(self.spec)

    @property
    def port(self) -> int:
        """The port the trial's engine serves on."""
        return render.engine_of(self.spec).port

    def workload(self) -> models.WorkloadSpec | None:
        workload = self.spec.tuning.workload
        if workload.source == "Synthetic":
            return workload
        return self.situation.live.workload

    def result(self, tuning: TuningStatus, *, progressed: bool = False) -> Decision:
        overlay = serving_overlay(tuning, self.spec.tuning.strategy)
        row = condition_row(tuning, self.why)
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
        return Decision(tuning, overlay, row, self.events, progressed, self.actions, self.why)

    # -- records -------------------------------------------------------------------------------

    def records(self, study: int) -> list[TrialRecord]:
        records = self.seen.records(study)
        quarantine = self.seen.quarantine(study)
        if quarantine.new and study not in self.quarantined:
            # Moved aside at once, as they were, so that the study and the serving go on.
            self.quarantined.add(study)
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
            self.save_records(study, records)
        return records

    def save_records(self, study: int, records: list[TrialRecord]) -> None:
        kept = self.seen.quarantine(study).kept
        self.actions.append(Apply(render.render_records(self.owner, study, dumps(records), kept)))

    # -- trial objects -------------------------------------------------------------------------

    def delete(self, action: Delete) -> None:
        self.deleted.add((action.kind, action.name))
        self.actions.append(action)

    def delete_trial_objects(self, *, keep: int | None, study: int | None = None) -> None:
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
                or (obj["kind"], meta["name"]) in self.deleted
            ):
                continue
            self.delete(Delete(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]))

    def trial_objects_left(self, study: int, trial: int) -> bool:
        """Whether the trial's pod or load Job is still there (deleting, or deleted by this
        step: the next step looks again)."""
        pod = self.seen.trial_pod(render.child_name(self.owner, "trial", study, trial))
        job, _ = self.seen.load_job(render.child_name(self.owner, "load", study, trial))
        return any(
            obj is not None and trials.controlled_by(obj, self.owner.uid) for obj in (pod, job)
        )
