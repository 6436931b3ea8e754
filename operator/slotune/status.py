"""Turns what the operator observed into the LLMDeployment's status.

Pure: the clock is passed in. Conditions carry the generation they describe, and a
condition's `lastTransitionTime` moves only when its status flips (a new reason or message
alone is not a transition). The events to emit are derived from the same comparison, so an
on-call engineer sees one event per real change, never one per reconcile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from slotune.models import (
    ActiveConfig,
    Condition,
    ConditionType,
    GpuStatus,
    LLMDeploymentSpec,
    LLMDeploymentStatus,
    Phase,
    ScalingStatus,
    SloStatus,
    TuningStatus,
)

ConditionStatus = Literal["True", "False", "Unknown"]
# (type, status, reason, message)
ConditionRow = tuple[str, ConditionStatus, str, str]


@dataclass(frozen=True)
class Event:
    """A Kubernetes event to post on the LLMDeployment."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class DeploymentState:
    """What the serving Deployment reports."""

    exists: bool
    desired: int = 0
    ready: int = 0
    updated: int = 0
    available: int = 0
    generation_observed: bool = True
    failure: str | None = None

    @classmethod
    def from_object(cls, obj: dict[str, Any] | None) -> DeploymentState:
        if obj is None:
            return cls(exists=False)
        status = obj.get("status") or {}
        failure = None
        for cond in status.get("conditions") or []:
            if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
                failure = cond.get("message") or cond.get("reason")
            if cond.get("type") == "Progressing" and cond.get("reason") == (
                "ProgressDeadlineExceeded"
            ):
                failure = cond.get("message") or "the rollout exceeded its progress deadline"
        return cls(
            exists=True,
            desired=int((obj.get("spec") or {}).get("replicas", 1)),
            ready=int(status.get("readyReplicas") or 0),
            updated=int(status.get("updatedReplicas") or 0),
            available=int(status.get("availableReplicas") or 0),
            generation_observed=status.get("observedGeneration", 0)
            >= (obj.get("metadata") or {}).get("generation", 0),
            failure=failure,
        )


@dataclass(frozen=True)
class Observation:
    """Everything a status is computed from, gathered by the reconciler."""

    generation: int
    spec: LLMDeploymentSpec | None  # parsed, even when it breaks a rule
    problems: list[str]  # why it cannot be served; empty when it can
    deployment: DeploymentState
    active_args: list[str]
    config_hash: str
    tuning: TuningStatus | None = None
    conflicts: list[str] = field(default_factory=list)  # others' objects in the children's place
    apply_failure: str | None = None  # a child the API server answered with an error
    tuning_row: ConditionRow | None = None  # the Tuning condition, from the study
    monitoring_rows: list[ConditionRow] = field(default_factory=list)  # SLOMet, ...
    slo: SloStatus | None = None
    gpu: GpuStatus | None = None
    serving_spec: dict[str, Any] | None = None  # the last valid spec, which the children run
    scaling: ScalingStatus | None = None  # Capacity and External scaling's figures
    scaling_row: ConditionRow | None = None  # ScalingLimited (Capacity scaling)
    selector: str | None = None  # the serving pods' label selector, for the scale subresource


def merge_condition(
    previous: list[Condition],
    row: ConditionRow,
    *,
    generation: int,
    now: datetime,
) -> Condition:
    """A condition whose transition time is kept unless its status flipped."""
    type_, status, reason, message = row
    old = next((c for c in previous if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )


def _ttft_summary(spec: LLMDeploymentSpec | None, slo: SloStatus | None) -> str | None:
    if spec is None or spec.slo is None or spec.slo.ttft is None:
        return None
    measured = (
        "-" if slo is None or slo.ttft_p95_seconds is None else f"{slo.ttft_p95_seconds:.3g}s"
    )
    return f"{measured}/{spec.slo.ttft.max_seconds:g}s"


def _serving_conditions(
    spec: LLMDeploymentSpec, dep: DeploymentState, config_hash: str
) -> tuple[Phase, list[ConditionRow]]:
    """Ready, Progressing and Degraded for a valid spec, from the Deployment's status."""
    desired = spec.replicas
    ready_count = dep.ready if dep.exists else 0
    all_ready = dep.exists and dep.ready >= desired and dep.generation_observed
    rolled = dep.exists and dep.updated >= desired and dep.generation_observed
    # An autoscaled deployment adding replicas still serves on those it had: it stays Ready
    # while every ready pod runs the current template, and Progressing says it scales out.
    scaling_out = (
        spec.scaling.mode != "Fixed"
        and not all_ready
        and dep.generation_observed
        and 0 < dep.ready <= dep.updated
    )
    ready = all_ready or scaling_out
    rows: list[ConditionRow] = [
        (
            ConditionType.READY,
            "True" if ready else "False",
            "ReplicasReady" if ready else "ReplicasNotReady",
            f"{ready_count} of {desired} replicas ready",
        ),
        (ConditionType.PROGRESSING, "False", "RolloutComplete", "configuration is live")
        if all_ready and rolled
        else (
            ConditionType.PROGRESSING,
            "True",
            "ScalingOut",
            f"{ready_count} of {desired} replicas ready; adding the rest",
        )
        if scaling_out
        else (
            ConditionType.PROGRESSING,
            "True",
            "RollingOut",
            f"rolling out configuration {config_hash}",
        ),
        (ConditionType.DEGRADED, "True", "RolloutFailed", dep.failure)
        if dep.failure
        else (ConditionType.DEGRADED, "False", "AsExpected", ""),
    ]
    if dep.failure:
        phase = Phase.DEGRADED
    elif ready:
        phase = Phase.READY
    elif dep.exists:
        phase = Phase.DEPLOYING
    else:
        phase = Phase.PENDING
    return phase, rows


# Status text is bounded: a problem may quote what the user wrote, and an object (spec,
# status and Kopf's annotations together) must stay well under the API server's limits.
CONDITION_MESSAGE_LIMIT = 4096
SUMMARY_LIMIT = 512


def clip(text: str, limit: int) -> str:
    """`text`, or its start and how much was left out when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    kept = max(limit - 40, 0)  # room for the note
    return f"{text[:kept]}... ({len(text) - kept} more characters)"


def _blocked_conditions(reason: str, why: list[str], waiting_for: str) -> list[ConditionRow]:
    """Nothing can be served until the user acts: an invalid spec, or a name that is taken.
    The reasons are written once, in Ready; Degraded points there."""
    return [
        (ConditionType.READY, "False", reason, clip("; ".join(why), CONDITION_MESSAGE_LIMIT)),
        (ConditionType.PROGRESSING, "False", reason, waiting_for),
        (ConditionType.DEGRADED, "True", reason, "see the Ready condition"),
    ]


def _summary(prefix: str, why: list[str]) -> str:
    """The status message: the first reason, and how many more the Ready condition lists."""
    more = f" (and {len(why) - 1} more in the Ready condition)" if len(why) > 1 else ""
    return clip(f"{prefix}{why[0]}", SUMMARY_LIMIT - len(more)) + more


def _feature_conditions(spec: LLMDeploymentSpec, observation: Observation) -> list[ConditionRow]:
    """Tuning and the on-call conditions, or what stands in for them before they are known."""
    rows: list[ConditionRow] = []
    if observation.tuning_row is not None:
        rows.append(observation.tuning_row)
    elif spec.tuning.enabled:
        rows.append((ConditionType.TUNING, "False", "NotStarted", "the study has not started"))
    rows += observation.monitoring_rows
    has_slo_row = any(row[0] == ConditionType.SLO_MET for row in observation.monitoring_rows)
    if spec.slo is not None and not has_slo_row:
        rows.append(
            (
                ConditionType.SLO_MET,
                "Unknown",
                "NotMeasured",
                "no Prometheus to read live SLO attainment from (spec.monitoring.prometheusURL)",
            )
        )
    return rows


def compute_status(
    observation: Observation, previous: LLMDeploymentStatus, now: datetime
) -> LLMDeploymentStatus:
    """The whole status for one observation."""
    spec = observation.spec
    dep = observation.deployment
    rows: list[ConditionRow]
    serving = spec if not observation.problems else None
    if serving is None:
        phase = Phase.INVALID
        rows = _blocked_conditions("InvalidSpec", observation.problems, "fix the spec to continue")
        active = previous.active_config
        message = _summary("Invalid spec: ", observation.problems)
    elif observation.conflicts:
        phase = Phase.DEGRADED
        rows = _blocked_conditions(
            "ChildConflict", observation.conflicts, "waiting for the name to be free"
        )
        active = previous.active_config
        message = _summary("Not deployed: ", observation.conflicts)
    else:
        phase, rows = _serving_conditions(serving, dep, observation.config_hash)
        if observation.apply_failure:
            # What runs keeps running; the condition names the child and the server's answer.
            failure = clip(f"{observation.apply_failure}; retrying", CONDITION_MESSAGE_LIMIT)
            phase = Phase.DEGRADED
            rows = [
                row
                if row[0] != ConditionType.DEGRADED
                else (row[0], "True", "ApplyFailed", failure)
                for row in rows
            ]
        rows += _feature_conditions(serving, observation)
        if observation.scaling_row is not None:
            rows.append(observation.scaling_row)
        if phase == Phase.READY and observation.tuning_row and observation.tuning_row[1] == "True":
            phase = Phase.TUNING
        active = ActiveConfig(args=observation.active_args, hash=observation.config_hash)
        message = rows[0][3]
        if observation.apply_failure:
            message = clip(f"{observation.apply_failure}; retrying", SUMMARY_LIMIT)

    conditions = [
        merge_condition(previous.conditions, row, generation=observation.generation, now=now)
        for row in rows
    ]
    desired_replicas = spec.replicas if spec is not None else previous.replicas
    ready_count = dep.ready if dep.exists else 0
    tuning = observation.tuning if serving is not None else previous.tuning
    trials = capacity = None
    if serving is not None and serving.tuning.enabled:
        tuning = tuning or TuningStatus(max_trials=serving.tuning.max_trials)
        trials = f"{tuning.trials_completed}/{serving.tuning.max_trials}"
        capacity = _capacity_summary(tuning)
    return LLMDeploymentStatus(
        observed_generation=observation.generation,
        phase=phase,
        message=message,
        replicas=desired_replicas,
        ready_replicas=ready_count,
        ready=f"{ready_count}/{desired_replicas or 0}",
        conditions=conditions,
        slo=observation.slo,
        slo_summary=_ttft_summary(spec, observation.slo),
        trials_summary=trials,
        capacity_summary=capacity,
        active_config=active,
        tuning=tuning,
        gpu=observation.gpu,
        serving_spec=observation.serving_spec,
        selector=observation.selector,
        scaling=observation.scaling,
    )


def _capacity_summary(tuning: TuningStatus) -> str | None:
    """`7.1/3.3` (req/s): the best capacity found against the rate it must carry."""
    if tuning.target_rate is None:
        return None
    best = tuning.best.capacity if tuning.best and tuning.best.capacity is not None else None
    shown = "-" if best is None else f"{best:.3g}"
    return f"{shown}/{tuning.target_rate:.3g}"


# Condition states an on-call engineer must look at.
_WARNING = {
    (ConditionType.READY, "False"),
    (ConditionType.DEGRADED, "True"),
    (ConditionType.SLO_MET, "False"),
    (ConditionType.GPU_THROTTLED, "True"),
    (ConditionType.METRICS_AVAILABLE, "False"),
    ("ScalingLimited", "True"),
}


def transitions(previous: LLMDeploymentStatus, current: LLMDeploymentStatus) -> list[Event]:
    """Events for conditions that flipped, or appeared, between two statuses."""
    events: list[Event] = []
    for cond in current.conditions:
        old = previous.condition(cond.type)
        if old is not None and old.status == cond.status and old.reason == cond.reason:
            continue
        warning = (cond.type, cond.status) in _WARNING
        if old is None and not warning and cond.type != ConditionType.PROGRESSING:
            continue  # a first, unremarkable state (Degraded=False, ...) is not news
        events.append(
            Event(
                type="Warning" if warning else "Normal",
                reason=f"{cond.type}{cond.status}" if cond.status != "Unknown" else cond.reason,
                message=f"{cond.type} is {cond.status} ({cond.reason})"
                + (f": {cond.message}" if cond.message else ""),
            )
        )
    return events


def to_patch(status: LLMDeploymentStatus) -> dict[str, Any]:
    """The status as JSON for the API, camelCase, without unset fields."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


# Live figures (SLO percentiles, the request rate, GPU clocks) move on every read; while every
# verdict stays the same they are written at most this often, not on every resync.
FIGURES_REFRESH = timedelta(minutes=1)
# Conditions whose messages quote those figures.
_FIGURE_CONDITIONS = {ConditionType.SLO_MET, ConditionType.GPU_THROTTLED, "ScalingLimited"}


def _verdicts(status: LLMDeploymentStatus) -> tuple[Any, ...]:
    """Everything in a status but the live figures."""
    slo, gpu = status.slo, status.gpu
    # Scaling's demand moves with every read too; its decision (the counts) is a verdict.
    scaling = status.scaling and status.scaling.model_copy(update={"demand": None, "message": None})
    rest = status.model_copy(
        update={
            "slo": None,
            "gpu": None,
            "conditions": [],
            "slo_summary": None,
            "scaling": scaling,
        }
    )
    conditions = [
        (c.type, c.status, c.reason, c.message if c.type not in _FIGURE_CONDITIONS else "")
        for c in status.conditions
    ]
    slo_verdict = slo and (slo.met, slo.stale, slo.violating_since, slo.window)
    targets = slo and [(t.name, t.met) for t in slo.targets]
    gpu_verdict = gpu and (gpu.throttle_reasons, gpu.clock_event_reasons)
    return (to_patch(rest), conditions, slo_verdict, targets, gpu_verdict)


def settle_figures(
    previous: LLMDeploymentStatus,
    current: LLMDeploymentStatus,
    now: datetime,
    refresh: timedelta = FIGURES_REFRESH,
) -> LLMDeploymentStatus:
    """`current`, or `previous` again when the two differ only in live figures and those were
    measured less than `refresh` ago: so a status is written when a verdict changes, and
    otherwise once a `refresh` at most."""
    measured = previous.slo.measured_at if previous.slo else None
    if measured is None or now - measured >= refresh:
        return current
    if _verdicts(previous) != _verdicts(current):
        return current
    return previous


def changed(previous: LLMDeploymentStatus, current: LLMDeploymentStatus) -> bool:
    return to_patch(previous) != to_patch(current)
