"""What the operator reads off trial pods, load Jobs and serving pods, and what it shows of a
study.

Pure: Kubernetes objects (plain dicts) in, small facts out. A trial pod is ready, still
starting, blocked by something no configuration can fix (no node has room for it), or failed
with a classified cause; a load Job is running, done with its measurement, or failed; a serving
pod of a new configuration is failing or not.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from slotune import models, render
from slotune.engine import DEFAULT_KIND, engine_or_default
from slotune.measure.record import Measurement
from slotune.tuner.records import TrialRecord, TrialState, record_capacity

HISTORY = 20  # trials kept in status; the ConfigMap keeps them all

# Waiting reasons that mean the container cannot be created at all: the configuration is not
# at fault, so the trial is not recorded as infeasible while they last.
_BLOCKING_WAITS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}


# The label the Job controller puts on the pods it creates: the Job's UID (batch/v1).
JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"


def controlled_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether the object's controller (its owner reference with `controller: true`) is the
    object with this UID. Names and labels anyone may copy; a trial counts only what slotune's
    own objects control."""
    return any(
        ref.get("controller") and ref.get("uid") == uid
        for ref in obj["metadata"].get("ownerReferences") or []
    )


def replaced(obj: dict[str, Any], made: str | None) -> str:
    """Why an object at a trial's name, controlled like slotune's, is still not the one slotune
    created (`made`: the UID the API server gave it, recorded in `status.tuning`), or "" when
    it is that one or nothing was recorded. Anyone who may create the kind can copy an owner
    reference; only the object slotune created has that UID."""
    uid = obj["metadata"].get("uid")
    if not made or uid == made:
        return ""
    meta = obj["metadata"]
    return (
        f"{obj.get('kind', 'object')} {meta.get('namespace')}/{meta['name']} is not the one "
        f"slotune created (its UID is {uid}, slotune's was {made}); slotune neither uses nor "
        "deletes it: delete it"
    )


def not_ours(obj: dict[str, Any]) -> str:
    """What a user reads about an object at a trial's name that slotune does not control."""
    meta = obj["metadata"]
    controller = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    by = (
        f"controlled by {controller['kind']} {controller['name']}"
        if controller
        else "not slotune's"
    )
    return (
        f"{obj.get('kind', 'object')} {meta.get('namespace')}/{meta['name']} already exists and is "
        f"{by}; slotune neither uses nor deletes it: delete or rename it"
    )


@dataclass(frozen=True)
class PodState:
    """A trial pod as the operator sees it."""

    phase: Literal["Starting", "Ready", "Blocked", "Failed", "Gone", "Conflict"]
    ip: str | None = None
    detail: str = ""
    failure_kind: str | None = None

    @classmethod
    def of(
        cls,
        pod: dict[str, Any] | None,
        *,
        startup_seconds: float | None = None,
        owner_uid: str | None = None,
        made: str | None = None,
    ) -> PodState:
        """With `owner_uid` (a trial pod): a pod that LLMDeployment does not control, or
        another than the one slotune created (`made`, its UID), is a `Conflict`, never the
        trial's engine."""
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return cls("Gone")
        if owner_uid is not None and not controlled_by(pod, owner_uid):
            return cls("Conflict", detail=not_ours({"kind": "Pod", **pod}))
        if why := replaced({"kind": "Pod", **pod}, made):
            return cls("Conflict", detail=why)
        # A trial pod's name label is its engine's kind (render.trial_labels).
        kind = (pod["metadata"].get("labels") or {}).get(render.LABEL_NAME, DEFAULT_KIND)
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if terminated is not None:
                return terminated_failure(terminated, startup_seconds, kind)
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _BLOCKING_WAITS:
                return cls("Blocked", detail=f"{waiting['reason']}: {waiting.get('message', '')}")
        if status.get("phase") == "Failed":
            return cls(
                "Failed", detail=status.get("message") or "the pod failed", failure_kind="Crash"
            )
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        scheduled = conditions.get("PodScheduled") or {}
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            return cls("Blocked", detail=f"Unschedulable: {scheduled.get('message', '')}")
        if (conditions.get("Ready") or {}).get("status") == "True" and status.get("podIP"):
            return cls("Ready", ip=status["podIP"])
        return cls("Starting")


def terminated_failure(
    terminated: dict[str, Any], seconds: float | None = None, kind: str = DEFAULT_KIND
) -> PodState:
    """A terminated engine: the termination message holds its log tail, which says why (read
    with the patterns of the engine of `kind`)."""
    log = terminated.get("message") or ""
    exit_code = terminated.get("exitCode")
    if terminated.get("reason") == "OOMKilled":
        log += "\nOOMKilled"
        exit_code = 137
    engine = engine_or_default(kind)
    failure = engine.classify_failure(log, exit_code=exit_code, timed_out=False, seconds=seconds)
    return PodState("Failed", detail=failure.describe(), failure_kind=str(failure.kind))


def first_failure(pods: list[dict[str, Any]]) -> str | None:
    """Why the first failing serving pod of `pods` fails, if one does."""
    return next((failure for pod in pods if (failure := serving_failure(pod))), None)


def serving_failure(pod: dict[str, Any]) -> str | None:
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
            state = terminated_failure(ended) if ended else None
            detail = state.detail if state else waiting.get("message", "")
            restarts = container.get("restartCount", 0)
            return f"{pod['metadata']['name']} failed (restarts: {restarts}): {detail}"
    return None


def made_by(pod: dict[str, Any], job: dict[str, Any]) -> bool:
    """Whether the pod is one the Job made: controlled by the Job's UID, labelled with it, and
    running the Job template's load container as rendered (image, command, arguments,
    environment, mounts, where the result goes) over the template's volumes. The Job
    controller adopts any orphan pod that carries its labels, so the owner reference alone is
    not enough: a pod made by someone else runs something else, or reports what the load
    generator measured. Other containers (an injected sidecar) and an image pinned to its
    digest by a webhook are the cluster's, not a forgery."""
    uid = job["metadata"].get("uid", "")
    if not controlled_by(pod, uid):
        return False
    if (pod["metadata"].get("labels") or {}).get(JOB_CONTROLLER_UID) != uid:
        return False
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    spec = pod.get("spec") or {}
    wanted, found = _load_container(template), _load_container(spec)
    if wanted is None or found is None or _running(found) != _running(wanted):
        return False
    # What the template mounts, as it mounts it (admission adds a service-account token mount).
    mounts = _names(wanted.get("volumeMounts"))
    volumes = _names(template.get("volumes"))
    return _named(found.get("volumeMounts"), mounts) == (wanted.get("volumeMounts") or []) and (
        _named(spec.get("volumes"), volumes) == (template.get("volumes") or [])
    )


def _load_container(pod_spec: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in pod_spec.get("containers") or [] if c.get("name") == render.LOAD_CONTAINER),
        None,
    )


def _names(entries: list[dict[str, Any]] | None) -> set[str]:
    return {str(e.get("name")) for e in entries or []}


def _named(entries: list[dict[str, Any]] | None, names: set[str]) -> list[dict[str, Any]]:
    return [e for e in entries or [] if str(e.get("name")) in names]


def _running(container: dict[str, Any]) -> tuple[Any, ...]:
    return (
        str(container.get("image", "")).split("@", 1)[0],  # a digest a webhook pinned
        container.get("command"),
        container.get("args"),
        container.get("env") or [],
        container.get("terminationMessagePath", render.TERMINATION_LOG),
    )


@dataclass(frozen=True)
class LoadState:
    """A load Job as the operator sees it."""

    phase: Literal["Running", "Done", "Failed", "Gone", "Conflict", "Void"]
    measurement: Measurement | None = None
    detail: str = ""

    @classmethod
    def of(
        cls,
        job: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        *,
        owner_uid: str,
        made: str | None = None,
    ) -> LoadState:
        """The Job counts only when the LLMDeployment (`owner_uid`) controls it and it is the
        one slotune created (`made`, its UID), and its result only from a pod the Job controls
        (by the Job's UID): any other pod, whatever its name or labels, is not read."""
        if job is None or job["metadata"].get("deletionTimestamp"):
            return cls("Gone")
        if not controlled_by(job, owner_uid):
            return cls("Conflict", detail=not_ours({"kind": "Job", **job}))
        if why := replaced({"kind": "Job", **job}, made):
            return cls("Conflict", detail=why)
        for pod in pods:
            if not made_by(pod, job):
                continue
            for container in (pod.get("status") or {}).get("containerStatuses") or []:
                terminated = (container.get("state") or {}).get("terminated")
                if terminated is None:
                    continue
                message = terminated.get("message") or ""
                if terminated.get("exitCode") == 0:
                    try:
                        return cls("Done", measurement=Measurement.model_validate_json(message))
                    except ValidationError:
                        return cls("Failed", detail=f"unreadable load result: {message[:300]}")
                return cls("Failed", detail=f"the load generator failed: {message[-600:]}")
        for condition in (job.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Complete" and condition.get("status") == "True":
                # Complete, but not by a pod it made: the Job controller counted a pod someone
                # else made with its labels. Nothing it measured is known: measured again.
                return cls("Void", detail="the load Job completed through a pod it did not make")
            if condition.get("type") == "Failed" and condition.get("status") == "True":
                reason = condition.get("reason") or "Failed"
                return cls(
                    "Failed",
                    detail=f"the load Job failed ({reason}): {condition.get('message', '')}",
                )
        return cls("Running")


ADDED_KNOBS = ("quantization", "long_prefill_token_threshold", "speculative")
"""Engine settings added after studies were first keyed by `spec_hash`."""


def _drop_unset(fields: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if fields.get(name) is None:
            fields.pop(name, None)


def spec_hash(spec: models.LLMDeploymentSpec) -> str:
    """Identifies what a study tunes. A change to it starts a new study; `apply`, `enabled`
    and the re-tune policy are left out, since changing them changes no measurement."""
    tuning = spec.tuning.model_dump(mode="json", exclude={"apply", "enabled", "retune"})
    # Fields added since, left out while unset (or at their defaults), for the same reason.
    if spec.tuning.quality == models.QualitySpec():
        del tuning["quality"]
    _drop_unset(tuning["search_space"], ADDED_KNOBS)
    engine = spec.engine.model_dump(
        mode="json", exclude={"kind"} if spec.engine.kind == DEFAULT_KIND else None
    )
    _drop_unset(engine["args"], ADDED_KNOBS)
    identity = {
        # A model source added since (image) is left out while unset, and the default engine
        # below: studies from before those fields existed are not restarted by an upgrade.
        "model": spec.model.model_dump(
            mode="json", exclude={"source": {"image"}} if spec.model.source.image is None else None
        ),
        "engine": engine,
        "resources": spec.resources.model_dump(mode="json"),
        "slo": spec.slo.model_dump(mode="json") if spec.slo else None,
        "tuning": tuning,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def shown(record: TrialRecord) -> models.TrialSummary:
    """A trial record as status shows it."""
    state = str(record.state) if record.phase == "screen" else f"{record.state} (re-measure)"
    return models.TrialSummary(
        number=record.number,
        params=record.params,
        state=state,
        score=round(record.score, 4),
        capacity=round(c.rate, 4) if (c := record_capacity(record)) else None,
        capacity_upper=round(c.upper, 4) if c and c.upper is not None else None,
        capacity_low=round(c.interval[0], 4) if c else None,
        capacity_high=round(high, 4) if c and (high := c.interval[1]) is not None else None,
        at_target=str(c.at_target) if c and c.at_target else None,
        feasible=record.feasible,
        cause=(record.cause or "")[:300] or None,
        quality=m.quality.describe() if (m := record.measurement) and m.quality else None,
        spec_decode_acceptance=m.spec_decode_acceptance if m else None,
    )


def summarize(records: list[TrialRecord], tuning: models.TuningStatus) -> models.TuningStatus:
    """The counters, best trial and bounded history a study's records give."""
    launched = [r for r in records if r.state != TrialState.REJECTED]
    feasible = [r for r in records if r.phase == "screen" and r.feasible]
    best = max(feasible, key=lambda r: r.score, default=None)
    return tuning.model_copy(
        update={
            "trials_completed": len(launched),
            "trials_failed": sum(1 for r in records if r.state == TrialState.FAILED),
            "best": shown(best) if best is not None else None,
            "trials": [shown(r) for r in records[-HISTORY:]],
        }
    )


def recommendation(
    spec: models.LLMDeploymentSpec,
    winner: TrialRecord,
    now: datetime,
    *,
    replicas: int | None = None,
) -> dict[str, Any]:
    """The winner, and a ready-to-commit patch of the spec that would make it permanent. With
    `replicas` (no configuration carries the target on one replica), the count that does; the
    patch sets `spec.replicas` when scaling is Fixed (Capacity scaling sizes the count itself,
    and under External the autoscaler does)."""
    args = models.EngineArgs.model_validate(winner.params)
    engine_args = args.model_dump(mode="json", by_alias=True, exclude_none=True)
    measured = winner.measurement.model_dump(exclude_none=True) if winner.measurement else {}
    patch: dict[str, Any] = {"engine": {"args": engine_args}}
    if replicas is not None and spec.scaling.mode == "Fixed":
        patch["replicas"] = replicas
    found: dict[str, Any] = {
        "trial": winner.number,
        "at": now.isoformat(),
        "engineArgs": engine_args,
        "measured": measured,
        "patch": json.dumps({"spec": patch}),
        "baselineArgs": spec.engine.args.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    if replicas is not None:
        found["replicas"] = replicas
    return found
