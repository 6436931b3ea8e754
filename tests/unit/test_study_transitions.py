"""The cluster study's transition function, table-tested from plain data.

Each row is one (state, observation) pair that `slotune.study.transitions` handles: the
study's place in status, what the API holds, what on-call says. The row names what the step
must decide: the state and trial step it leaves, the actions (in order), the events, and
whether another step may follow at once. No API, fake or real, is involved: the observation
is the plain data below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import pytest
from tests.support.specs import llm_spec, tuning, workload

from slotune import models, render
from slotune.measure.capacity import Capacity
from slotune.measure.record import Measurement
from slotune.models import CurrentTrial, LLMDeploymentSpec, TunedConfig, TuningStatus
from slotune.study import trials
from slotune.study.transitions import (
    TRIAL_STEPS,
    Apply,
    Decision,
    Live,
    Quarantine,
    Settings,
    Situation,
    decide,
)
from slotune.tuner import sampling
from slotune.tuner.records import TrialRecord, TrialState
from slotune.tuner.sampling import infeasible_constraints

OWNER = render.Owner(name="chat", namespace="llm", uid="u-1")
NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
STARTUP = Settings().startup_seconds


def spec(**fields: Any) -> LLMDeploymentSpec:
    # Tuning needs an SLO (the API refuses one without), so "no SLO" is no state here.
    return llm_spec(
        resources={"gpus": 0},
        tuning=tuning(workload(prompt=512, duration="20s"), **{"maxTrials": 3, **fields}),
    )


SPEC = spec()
HASH = trials.spec_hash(SPEC)
TRIAL_HASH = "cafe123456"


@dataclass
class Observed:
    """An observation as plain data (`transitions.Observation`)."""

    records_by_study: dict[int, list[TrialRecord]] = field(default_factory=dict)
    objects: list[dict[str, Any]] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]]]] = field(
        default_factory=dict
    )
    serving: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    quarantined: dict[int, Quarantine] = field(default_factory=dict)

    def records(self, study: int) -> list[TrialRecord]:
        return self.records_by_study.get(study, [])

    def quarantine(self, study: int) -> Quarantine:
        return self.quarantined.get(study, Quarantine())

    def trial_objects(self) -> list[dict[str, Any]]:
        return self.objects

    def trial_pod(self, name: str) -> dict[str, Any] | None:
        return self.pods.get(name)

    def trial_policy(self, name: str) -> dict[str, Any] | None:
        return self.policies.get(name)

    def load_job(self, name: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        return self.jobs.get(name, (None, []))

    def serving_pods(self, config_hash: str) -> list[dict[str, Any]]:
        return self.serving.get(config_hash, [])


# --- plain objects ------------------------------------------------------------------------------


def trial_object(kind: str, study: int, trial: int, *, deleting: bool = False) -> dict[str, Any]:
    prefix, api = ("trial", "v1") if kind == "Pod" else ("load", "batch/v1")
    meta: dict[str, Any] = {
        "name": render.child_name(OWNER, prefix, study, trial),
        "namespace": OWNER.namespace,
        "labels": {render.LABEL_STUDY: str(study), render.LABEL_TRIAL: str(trial)},
        "ownerReferences": [OWNER.reference()],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T08:59:00Z"
    return {"apiVersion": api, "kind": kind, "metadata": meta}


def ready_pod(ip: str = "10.0.0.7") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": {}, "ownerReferences": [OWNER.reference()]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def starting_pod() -> dict[str, Any]:
    meta = {"name": "p", "labels": {}, "ownerReferences": [OWNER.reference()]}
    return {"metadata": meta, "status": {"phase": "Pending"}}


def oom_pod() -> dict[str, Any]:
    terminated = {"exitCode": 137, "reason": "OOMKilled", "message": "Loading weights"}
    return {
        "metadata": {"name": "p", "labels": {}, "ownerReferences": [OWNER.reference()]},
        "status": {"containerStatuses": [{"name": "vllm", "state": {"terminated": terminated}}]},
    }


def unschedulable_pod() -> dict[str, Any]:
    scheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes have a free GPU",
    }
    meta = {"name": "p", "labels": {}, "ownerReferences": [OWNER.reference()]}
    return {"metadata": meta, "status": {"conditions": [scheduled]}}


def crashing_pod() -> dict[str, Any]:
    status = {
        "containerStatuses": [
            {
                "name": "vllm",
                "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
            }
        ]
    }
    return {"metadata": {"name": "chat-abc", "labels": {}}, "status": status}


MEASURED = Measurement(
    capacity=Capacity(capacity=2.2, upper=2.5, target_rate=2.0, feasible=True, stopped="bracketed"),
    slo_percentiles={"ttft": 0.4, "tpot": 0.03},
)


def completed_job_without_its_pod() -> tuple[Any, list[Any]]:
    """Complete by the Job controller's count, through a pod it adopted and did not make."""
    job, _ = load_job()
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    return job, []


LOAD = {"name": "load", "image": "slotune:1", "command": ["slotune"], "args": ["trial-load"]}


def load_job(*, exit_code: int | None = None, message: str = "") -> tuple[Any, list[Any]]:
    job = {
        "metadata": {"name": "j", "uid": "job-uid", "ownerReferences": [OWNER.reference()]},
        "spec": {"template": {"spec": {"containers": [LOAD]}}},
    }
    if exit_code is None:
        return {**job, "status": {}}, []
    terminated = {"exitCode": exit_code, "message": message}
    # As the Job controller makes it: controlled by the Job, labelled with its UID.
    meta = {
        "name": "j-pod",
        "labels": {trials.JOB_CONTROLLER_UID: "job-uid"},
        "ownerReferences": [{"kind": "Job", "name": "j", "uid": "job-uid", "controller": True}],
    }
    status = {"containerStatuses": [{"state": {"terminated": terminated}}]}
    pods = [{"metadata": meta, "spec": {"containers": [LOAD]}, "status": status}]
    return {**job, "status": {}}, pods


def record(number: int, state: TrialState = TrialState.FAILED, **extra: Any) -> TrialRecord:
    return TrialRecord(
        number=number,
        params={"max_num_batched_tokens": 256 * (number + 1)},
        state=state,
        cause="the engine was killed" if state == TrialState.FAILED else None,
        constraints=infeasible_constraints(),
        **extra,
    )


# --- study states -----------------------------------------------------------------------------


def status(**fields: Any) -> TuningStatus:
    base: dict[str, Any] = {
        "state": "Tuning",
        "study": 1,
        "spec_hash": HASH,
        "started_at": NOW - timedelta(hours=1),
        "max_trials": 3,
    }
    return TuningStatus(**{**base, **fields})


def trial(step: str, *, waited: float = 10.0, number: int = 1, **fields: Any) -> CurrentTrial:
    return CurrentTrial(
        number=number,
        label="vllm-defaults",
        params={"max_num_batched_tokens": 2048},
        step=step,  # type: ignore[arg-type]
        since=NOW - timedelta(seconds=waited),
        started_at=NOW - timedelta(seconds=waited + 60),
        config_hash=TRIAL_HASH,
        **fields,
    )


POD = render.child_name(OWNER, "trial", 1, 1)
JOB = render.child_name(OWNER, "load", 1, 1)
PROMOTED = TunedConfig(params={"max_num_batched_tokens": 512}, trial=2, study=1, hash="beef")
LAST_GOOD = TunedConfig(params={}, hash="0ld")


def promoting(at: float = 60.0, **fields: Any) -> TuningStatus:
    promoted = PROMOTED.model_copy(update={"at": NOW - timedelta(seconds=at)})
    return status(state="Promoting", promoted=promoted, last_good=LAST_GOOD, **fields)


@dataclass(frozen=True)
class Row:
    """One (state, observation) pair and what the step must decide."""

    previous: TuningStatus | None
    seen: Observed = field(default_factory=Observed)
    spec: LLMDeploymentSpec = SPEC
    live: Live = field(default_factory=Live)
    active_hash: str = ""
    serving_ready: bool = False
    # expected
    state: str | None = "Tuning"
    step: str | None = None
    actions: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    progressed: bool = False
    says: str = ""  # in status.tuning.message, the current trial's note, or the condition


def summary(decision: Decision) -> tuple[str, ...]:
    out = []
    for action in decision.actions:
        if isinstance(action, Apply):
            out.append(f"apply {action.obj['kind']}")
        else:
            out.append(f"delete {action.kind} {action.name}")
    return tuple(out)


STRAY_POD = trial_object("Pod", 1, 7)
STRAY_JOB = trial_object("Job", 1, 7)
SPEC_CHANGED = status(spec_hash="0ther")
IN_PLACE = spec(strategy="InPlace")
LIVE = spec(workload={"source": "Live", "duration": "20s"})
AUTO = spec(apply="Auto")
RECOMMEND = spec(apply="Recommend")

ROWS: dict[str, Row] = {
    # tuning off, or no SLO
    "off, never tuned: nothing to do": Row(None, spec=spec(enabled=False), state=None),
    "off, after a study: its trial objects go, the spec serves": Row(
        status(state="Completed", promoted=PROMOTED),
        Observed(objects=[STRAY_POD]),
        spec=spec(enabled=False),
        state="Completed",
        actions=(f"delete Pod {STRAY_POD['metadata']['name']}",),
        says="tuning is disabled",
    ),
    # a hold
    "Prometheus unreachable, mid-study: hold": Row(
        status(current=trial("Launching")), live=Live(hold=True), step="Launching", says="Held"
    ),
    "Prometheus unreachable, before any study: hold": Row(
        None, live=Live(hold=True), state=None, says="Held"
    ),
    "a hold beats a spec change": Row(SPEC_CHANGED, live=Live(hold=True), says="Held"),
    # a new study
    "first study": Row(
        None, actions=("apply ConfigMap",), events=("TuningStarted",), progressed=True
    ),
    "spec changed: a new study, the old trial objects go": Row(
        SPEC_CHANGED,
        Observed(objects=[STRAY_POD, STRAY_JOB]),
        actions=(
            f"delete Pod {STRAY_POD['metadata']['name']}",
            f"delete Job {STRAY_JOB['metadata']['name']}",
            "apply ConfigMap",
        ),
        events=("TuningStarted",),
        progressed=True,
        says="study 2 started (SpecChanged)",
    ),
    # a study that ended
    "completed: nothing to do": Row(status(state="Completed"), state="Completed"),
    "rolled back: nothing to do": Row(status(state="RolledBack"), state="RolledBack"),
    "completed, a re-tune is due: a new study": Row(
        status(state="Completed", promoted=PROMOTED),
        live=Live(retune="SLOMissed"),
        actions=("apply ConfigMap",),
        events=("TuningStarted",),
        progressed=True,
        says="study 2 started (SLOMissed)",
    ),
    "recommended, then apply set to Auto: the recommendation is promoted": Row(
        status(state="Recommended", recommendation={"trial": 2}),
        Observed(records_by_study={1: [record(2, TrialState.MEASURED, measurement=MEASURED)]}),
        spec=AUTO,
        state="Promoting",
        events=("Promoting",),
        progressed=True,
    ),
    "recommended, apply still Recommend: nothing to do": Row(
        status(state="Recommended", recommendation={"trial": 2}),
        spec=RECOMMEND,
        state="Recommended",
    ),
    # promoting a winner
    "promoting, nothing promoted (status edited): completed": Row(
        status(state="Promoting"), state="Completed"
    ),
    "promoting, its pods crash: rolled back": Row(
        promoting(),
        Observed(serving={"beef": [crashing_pod()]}),
        state="RolledBack",
        events=("RolledBack",),
        progressed=True,
        says="its pods failed",
    ),
    "promoting, not ready in time: rolled back": Row(
        promoting(at=STARTUP + 1),
        state="RolledBack",
        events=("RolledBack",),
        progressed=True,
        says="not ready after",
    ),
    "promoting, rolling out: wait": Row(promoting(), state="Promoting"),
    "promoted and ready: the SLO check starts": Row(
        promoting(),
        active_hash="beef",
        serving_ready=True,
        state="Promoting",
        says="checking the SLO",
    ),
    "promoted, the SLO missed over a window: rolled back": Row(
        promoting(verify_since=NOW - timedelta(minutes=6)),
        live=Live(slo_met=False, slo_measured_at=NOW, slo_detail="ttft p95 2.4 s"),
        active_hash="beef",
        serving_ready=True,
        state="RolledBack",
        events=("RolledBack",),
        progressed=True,
        says="missed the SLO",
    ),
    "promoted, the SLO met over a window: completed": Row(
        promoting(verify_since=NOW - timedelta(minutes=6)),
        live=Live(slo_met=True, slo_measured_at=NOW),
        active_hash="beef",
        serving_ready=True,
        state="Completed",
        events=("Promoted",),
        says="met the SLO on live traffic",
    ),
    "promoted, a window without traffic: completed on readiness": Row(
        promoting(verify_since=NOW - timedelta(minutes=6)),
        active_hash="beef",
        serving_ready=True,
        state="Completed",
        events=("Promoted",),
        says="no live traffic",
    ),
    # planning
    "no trial in flight: the first is planned": Row(
        status(), step="Launching", progressed=True, says="trial 0: trying"
    ),
    "no trial in flight, stray trial objects: they go, then a plan": Row(
        status(),
        Observed(objects=[STRAY_POD]),
        step="Launching",
        actions=(f"delete Pod {STRAY_POD['metadata']['name']}",),
        progressed=True,
    ),
    "Live workload without traffic yet: wait": Row(
        status(), spec=LIVE, says="waiting for live traffic"
    ),
    "every trial failed within the budget: completed, nothing promoted": Row(
        status(),
        Observed(records_by_study={1: [record(0), record(1), record(2)]}),
        state="Completed",
        events=("NoConfigurationMetSLO",),
        says="no configuration met the SLO",
    ),
    # launching (Canary)
    "launching, no pod yet: the trial pod is created": Row(
        status(current=trial("Launching")),
        step="Launching",
        actions=("apply NetworkPolicy", "apply Pod"),
    ),
    "launching, a pod slotune does not control at the trial's name: a conflict, it waits": Row(
        status(current=trial("Launching")),
        Observed(pods={POD: {**ready_pod(), "metadata": {"name": POD, "labels": {}}}}),
        step="Launching",
        events=("ChildConflict",),
        says="ChildConflict",
    ),
    "launching, a pod controlled like slotune's but not the one it created: a conflict": Row(
        status(current=trial("Launching", pod_uid="slotunes")),
        Observed(pods={POD: {**ready_pod(), "metadata": {**ready_pod()["metadata"], "uid": "x"}}}),
        step="Launching",
        events=("ChildConflict",),
        says="not the one slotune created",
    ),
    "measuring, a load Job controlled like slotune's but not the one it created: a conflict": Row(
        status(current=trial("Measuring", job_uid="slotunes")),
        Observed(pods={POD: ready_pod()}, jobs={JOB: load_job(exit_code=0, message="{}")}),
        step="Measuring",
        events=("ChildConflict",),
        says="not the one slotune created",
    ),
    "launching, a NetworkPolicy slotune does not control at the trial's name: a conflict": Row(
        status(current=trial("Launching")),
        Observed(policies={POD: {"metadata": {"name": POD, "uid": "theirs"}, "spec": {}}}),
        step="Launching",
        events=("ChildConflict",),
        says="ChildConflict",
    ),
    "launching, slotune's own NetworkPolicy already there (a restart): the pod follows": Row(
        status(current=trial("Launching")),
        Observed(
            policies={POD: {"metadata": {"name": POD, "ownerReferences": [OWNER.reference()]}}}
        ),
        step="Launching",
        actions=("apply NetworkPolicy", "apply Pod"),
    ),
    "a record line that does not load: moved aside, said in the condition, the study goes on": Row(
        status(current=trial("Launching")),
        Observed(
            quarantined={1: Quarantine(kept="not json\n", new=["line 2: not json"])},
        ),
        step="Launching",
        actions=("apply ConfigMap", "apply NetworkPolicy", "apply Pod"),
        events=("RecordsQuarantined",),
        says="1 trial record line(s) that did not load are kept",
    ),
    "launching, the engine is ready: the load Job starts": Row(
        status(current=trial("Launching")),
        Observed(pods={POD: ready_pod()}, objects=[trial_object("Pod", 1, 1)]),
        step="Measuring",
        actions=("apply Job",),
    ),
    "launching, ready but no live traffic to shape the load: wait": Row(
        status(current=trial("Launching")),
        Observed(pods={POD: ready_pod()}),
        spec=LIVE,
        step="Launching",
        says="waiting for live traffic",
    ),
    "launching, the engine was OOM-killed: recorded as failed, cleaned up": Row(
        status(current=trial("Launching")),
        Observed(pods={POD: oom_pod()}, objects=[trial_object("Pod", 1, 1)]),
        step="CleaningUp",
        actions=("apply ConfigMap", f"delete Pod {POD}"),
        events=("TrialFailed",),
        progressed=True,
    ),
    "launching, no room for a canary: blocked, with the way out": Row(
        status(current=trial("Launching")),
        Observed(pods={POD: unschedulable_pod()}),
        step="Launching",
        says="strategy InPlace tunes without one",
    ),
    "launching, not ready in time: recorded as failed (Timeout)": Row(
        status(current=trial("Launching", waited=STARTUP + 1)),
        Observed(pods={POD: starting_pod()}),
        step="CleaningUp",
        actions=("apply ConfigMap",),
        events=("TrialFailed",),
        progressed=True,
    ),
    "launching, still starting: wait": Row(
        status(current=trial("Launching")), Observed(pods={POD: starting_pod()}), step="Launching"
    ),
    "launching, a stray trial's objects: they go": Row(
        status(current=trial("Launching")),
        Observed(pods={POD: starting_pod()}, objects=[trial_object("Pod", 1, 1), STRAY_JOB]),
        step="Launching",
        actions=(f"delete Job {STRAY_JOB['metadata']['name']}",),
    ),
    # launching (InPlace)
    "in place, the rollout crashes: recorded as failed": Row(
        status(current=trial("Launching")),
        Observed(serving={TRIAL_HASH: [crashing_pod()]}),
        spec=IN_PLACE,
        step="CleaningUp",
        actions=("apply ConfigMap",),
        events=("TrialFailed",),
        progressed=True,
    ),
    "in place, rolled out and ready: the load Job starts": Row(
        status(current=trial("Launching")),
        Observed(serving={TRIAL_HASH: [ready_pod()]}),
        spec=IN_PLACE,
        active_hash=TRIAL_HASH,
        serving_ready=True,
        step="Measuring",
        actions=("apply Job",),
    ),
    "in place, not rolled out in time: recorded as failed": Row(
        status(current=trial("Launching", waited=STARTUP + 1)),
        spec=IN_PLACE,
        step="CleaningUp",
        actions=("apply ConfigMap",),
        events=("TrialFailed",),
        progressed=True,
    ),
    "in place, rolling out: wait": Row(
        status(current=trial("Launching")), spec=IN_PLACE, step="Launching"
    ),
    # measuring
    "measuring, the engine pod is gone: recorded as failed": Row(
        status(current=trial("Measuring")),
        Observed(jobs={JOB: load_job()}, objects=[trial_object("Job", 1, 1)]),
        step="CleaningUp",
        actions=("apply ConfigMap", f"delete Job {JOB}"),
        events=("TrialFailed",),
        progressed=True,
    ),
    "measuring in place, the serving pods crash: recorded as failed": Row(
        status(current=trial("Measuring")),
        Observed(serving={TRIAL_HASH: [crashing_pod()]}),
        spec=IN_PLACE,
        step="CleaningUp",
        actions=("apply ConfigMap",),
        events=("TrialFailed",),
        progressed=True,
    ),
    "measuring, the load Job is gone: launched again": Row(
        status(current=trial("Measuring")),
        Observed(pods={POD: ready_pod()}),
        step="Launching",
        progressed=True,
    ),
    "measuring, the load Job failed: recorded (LoadFailed)": Row(
        status(current=trial("Measuring")),
        Observed(pods={POD: ready_pod()}, jobs={JOB: load_job(exit_code=1, message="boom")}),
        step="CleaningUp",
        actions=("apply ConfigMap",),
        events=("TrialFailed",),
        progressed=True,
    ),
    "measuring, done: recorded as measured, cleaned up": Row(
        status(current=trial("Measuring")),
        Observed(
            pods={POD: ready_pod()},
            jobs={JOB: load_job(exit_code=0, message=MEASURED.model_dump_json())},
            objects=[trial_object("Pod", 1, 1), trial_object("Job", 1, 1)],
        ),
        step="CleaningUp",
        actions=("apply ConfigMap", f"delete Pod {POD}", f"delete Job {JOB}"),
        events=("TrialMeasured",),
        progressed=True,
    ),
    "measuring, done on throttled GPUs: the measurement is discarded": Row(
        status(current=trial("Measuring")),
        Observed(
            pods={POD: ready_pod()},
            jobs={JOB: load_job(exit_code=0, message=MEASURED.model_dump_json())},
        ),
        live=Live(throttled=True),
        step="Measuring",
        actions=(f"delete Job {JOB}",),
        events=("TrialDiscarded",),
        says="the GPUs were throttled",
    ),
    "measuring, the Job completed through a pod it did not make: discarded, measured again": Row(
        status(current=trial("Measuring")),
        Observed(pods={POD: ready_pod()}, jobs={JOB: completed_job_without_its_pod()}),
        step="Measuring",
        actions=(f"delete Job {JOB}",),
        events=("TrialDiscarded",),
        says="through a pod it did not make",
    ),
    "measuring, a third Job completed through a pod it did not make: the trial failed": Row(
        status(current=trial("Measuring", voided=2)),
        Observed(pods={POD: ready_pod()}, jobs={JOB: completed_job_without_its_pod()}),
        step="CleaningUp",
        actions=("apply ConfigMap",),
        events=("TrialFailed",),
        progressed=True,
    ),
    "launching, a Job slotune does not control at the load Job's name: a conflict": Row(
        status(current=trial("Launching")),
        Observed(
            pods={POD: ready_pod()},
            jobs={JOB: ({"metadata": {"name": JOB, "uid": "other"}, "status": {}}, [])},
        ),
        step="Launching",
        events=("ChildConflict",),
        says="ChildConflict",
    ),
    "measuring, a Job slotune does not control at the load Job's name: a conflict": Row(
        status(current=trial("Measuring")),
        Observed(
            pods={POD: ready_pod()},
            jobs={JOB: ({"metadata": {"name": JOB, "uid": "other"}, "status": {}}, [])},
        ),
        step="Measuring",
        events=("ChildConflict",),
        says="ChildConflict",
    ),
    "measuring, the load runs: wait": Row(
        status(current=trial("Measuring")),
        Observed(pods={POD: ready_pod()}, jobs={JOB: load_job()}),
        step="Measuring",
    ),
    "measured already (a restart after the record was kept): not kept twice": Row(
        status(current=trial("Measuring")),
        Observed(
            records_by_study={1: [record(1, TrialState.MEASURED, measurement=MEASURED)]},
            pods={POD: ready_pod()},
            jobs={JOB: load_job(exit_code=0, message=MEASURED.model_dump_json())},
        ),
        step="CleaningUp",
        progressed=True,
    ),
    # cleaning up
    "cleaning up, the objects are there: they go, and it looks again": Row(
        status(current=trial("CleaningUp")),
        Observed(pods={POD: ready_pod()}, objects=[trial_object("Pod", 1, 1)]),
        step="CleaningUp",
        actions=(f"delete Pod {POD}",),
        progressed=True,
    ),
    "cleaning up, the objects are terminating: wait": Row(
        status(current=trial("CleaningUp")),
        Observed(pods={POD: ready_pod()}, objects=[trial_object("Pod", 1, 1, deleting=True)]),
        step="CleaningUp",
    ),
    "cleaning up, the objects are gone: the next trial is planned": Row(
        status(current=trial("CleaningUp")), step=None, progressed=True
    ),
}


def situation_of(row: Row) -> Situation:
    """The row's situation; a previous status of the study of `HASH` is its spec's study."""
    previous = row.previous
    if previous is not None and previous.spec_hash == HASH:  # the study of the row's spec
        previous = previous.model_copy(update={"spec_hash": trials.spec_hash(row.spec)})
    return Situation(
        owner=OWNER,
        spec=row.spec,
        previous=previous,
        now=NOW,
        active_hash=row.active_hash,
        serving_ready=row.serving_ready,
        live=row.live,
    )


@pytest.mark.parametrize("name", list(ROWS))
def test_the_transition(name: str) -> None:
    row = ROWS[name]
    decision = decide(situation_of(row), row.seen)
    tuning = decision.tuning
    assert (tuning.state if tuning else None) == row.state
    current = tuning.current if tuning else None
    assert (current.step if current else None) == row.step
    assert summary(decision) == row.actions
    assert tuple(e.reason for e in decision.events) == row.events
    assert decision.progressed == row.progressed
    said = " | ".join(
        text
        for text in (
            tuning.message if tuning else None,
            current.note if current else None,
            " ".join(decision.row) if decision.row else None,
        )
        if text
    )
    assert row.says in said


def test_a_decision_touches_nothing_it_was_given() -> None:
    """Pure: the previous status and the observation come out as they went in."""
    row = ROWS["measuring, done: recorded as measured, cleaned up"]
    previous = row.previous.model_copy(deep=True) if row.previous else None
    situation = Situation(OWNER, row.spec, row.previous, NOW, "", False)
    first = decide(situation, row.seen)
    again = decide(situation, row.seen)
    assert row.previous == previous
    assert summary(first) == summary(again)
    assert first.tuning == again.tuning


def test_the_trial_objects_uids_are_recorded_once_seen_and_kept() -> None:
    """A pod and a Job slotune controls, seen without a recorded UID (the status write after
    their creation was lost), have theirs recorded; a recorded UID is not overwritten."""
    pod = {**ready_pod(), "metadata": {**ready_pod()["metadata"], "uid": "p1"}}
    seen = Observed(pods={POD: pod})
    decision = decide(situation_of(Row(status(current=trial("Launching")))), seen)
    assert decision.tuning is not None
    assert decision.tuning.current is not None
    assert decision.tuning.current.pod_uid == "p1"
    measuring = status(current=trial("Measuring", pod_uid="p1"))
    jobs = {JOB: load_job()}
    decision = decide(situation_of(Row(measuring)), Observed(pods=seen.pods, jobs=jobs))
    assert decision.tuning is not None
    assert decision.tuning.current is not None
    assert (decision.tuning.current.pod_uid, decision.tuning.current.job_uid) == ("p1", "job-uid")


def test_every_trial_step_has_a_row_for_every_strategy() -> None:
    """The table is keyed by the API's own trial steps and strategies: one missing is a step
    no study could take."""
    steps = get_args(CurrentTrial.model_fields["step"].annotation)
    strategies = get_args(models.TuningSpec.model_fields["strategy"].annotation)
    assert set(TRIAL_STEPS) == {(s, k) for s in steps for k in strategies}


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("off, never tuned: nothing to do", "tuning is off, or the spec has no SLO"),
        ("a hold beats a spec change", "Prometheus is unreachable"),
        ("first study", "no study yet, or the spec changed"),
        ("promoting, rolling out: wait", "a winner is being promoted"),
        (
            "no trial in flight: the first is planned",
            "trials are under way; no trial is in flight: the next is planned",
        ),
        (
            "launching, still starting: wait",
            "trials are under way; the trial's canary pod is starting",
        ),
        (
            "in place, rolling out: wait",
            "trials are under way; the serving Deployment is rolling out the trial",
        ),
        (
            "measuring in place, the serving pods crash: recorded as failed",
            "trials are under way; the load Job is measuring the serving pods",
        ),
    ],
)
def test_the_rows_that_chose_a_step_say_why(name: str, why: str) -> None:
    row = ROWS[name]
    assert decide(situation_of(row), row.seen).why == why


def test_a_status_without_a_message_shows_why_in_the_condition() -> None:
    decision = decide(situation_of(Row(status(state="Completed"))), Observed())
    assert decision.row is not None
    assert decision.row[3] == "the study ended"


def test_recording_a_trial_builds_no_optuna_study(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only planning the next trial needs the sampler's study; scoring one is pure."""

    def refused(*_: Any, **__: Any) -> None:
        raise AssertionError("an Optuna study was built")

    monkeypatch.setattr(sampling, "create_study", refused)
    for name in (
        "launching, the engine is ready: the load Job starts",
        "measuring, done: recorded as measured, cleaned up",
    ):
        row = ROWS[name]
        assert summary(decide(situation_of(row), row.seen)) == row.actions
