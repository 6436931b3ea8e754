"""One level-based reconcile: observe → validate → render → apply → status.

Create, resume, update, the periodic timer and changes to owned children all run this same
function, which recomputes everything from the current object. It never writes `spec`: what
the operator learns goes to `status`, and a spec it cannot serve becomes a condition that says
what to fix while the children keep serving the last good configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slotune import render, scaling, study
from slotune.engine import ENGINES
from slotune.kube import KubeApi, KubeError, Ref, schema_problems
from slotune.models import (
    GpuStatus,
    LLMDeploymentSpec,
    LLMDeploymentStatus,
    SloStatus,
    TuningStatus,
)
from slotune.spec import PSA_ENFORCE_LABEL, parse_spec, privilege_asked, privilege_problems
from slotune.status import (
    ConditionRow,
    DeploymentState,
    Event,
    Observation,
    changed,
    compute_status,
    settle_figures,
    to_patch,
    transitions,
)

POD_MONITOR_API = "monitoring.coreos.com/v1"
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"


@dataclass
class Reconciled:
    """What one reconcile did, for the Kopf layer to report."""

    status: LLMDeploymentStatus
    events: list[Event] = field(default_factory=list)
    status_written: bool = False
    invalid: str | None = None
    progressed: bool = False  # the study can take another step right away
    spec: LLMDeploymentSpec | None = None  # as parsed, for the operator's metrics
    apply_failure: str | None = None  # a child the server would not take now: retry later
    # The object as this reconcile left it: as read, or as its status write gave it back.
    seen: dict[str, Any] | None = None


class ChildApplyError(Exception):
    """The API server answered an apply of one child with an error; the children before it
    were applied (`deployment`, when it was among them)."""

    def __init__(self, child: dict[str, Any], error: KubeError, deployment: dict[str, Any] | None):
        ref = Ref.of(child)
        super().__init__(
            f"could not apply {ref.kind} {ref.namespace}/{ref.name}: "
            f"{error.status} {error.reason}: {error.message}"
        )
        self.error = error
        self.deployment = deployment


@dataclass(frozen=True)
class Watch:
    """What on-call monitoring contributes to one reconcile."""

    live: study.Live = field(default_factory=study.Live)
    rows: list[ConditionRow] = field(default_factory=list)  # SLOMet, MetricsAvailable, ...
    slo: SloStatus | None = None
    gpu: GpuStatus | None = None
    demand: float | None = None  # the peak arrival rate over the stabilization window


# (spec, previous status, namespace, served model name, now) -> what monitoring says
Monitor = Callable[[LLMDeploymentSpec, LLMDeploymentStatus, str, str, datetime], Watch | None]


def _serving_ready(deployment: dict[str, Any] | None) -> bool:
    """Every replica runs the Deployment's current template and is ready (rollout done)."""
    if deployment is None:
        return False
    desired = int(deployment["spec"].get("replicas", 1))
    status = deployment.get("status") or {}
    generation = deployment["metadata"].get("generation", 0)
    return (
        status.get("observedGeneration", 0) >= generation
        and int(status.get("updatedReplicas") or 0) == desired
        and int(status.get("readyReplicas") or 0) >= desired
        and int(status.get("replicas") or 0) == desired
    )


def _active_config(deployment: dict[str, Any] | None) -> tuple[list[str], str]:
    """The flags and config hash the serving Deployment's pod template runs."""
    if deployment is None:
        return [], ""
    template = deployment["spec"]["template"]
    containers = template["spec"]["containers"]
    names = {engine.container_name for engine in ENGINES.values()}
    args: list[str] = next((c.get("args", []) for c in containers if c["name"] in names), [])
    return list(args), template["metadata"].get("labels", {}).get(render.LABEL_CONFIG_HASH, "")


def reconcile(
    body: dict[str, Any],
    kube: KubeApi,
    now: datetime,
    *,
    monitor: Monitor | None = None,
    settings: study.Settings | None = None,
) -> Reconciled:
    """Bring the children of one LLMDeployment to its spec and report in its status."""
    meta = body["metadata"]
    owner = render.Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    previous = LLMDeploymentStatus.model_validate(body.get("status") or {})
    spec, problems = parse_spec(body.get("spec") or {}, schema_problems)
    deployment: dict[str, Any] | None = kube.get(
        Ref("apps/v1", "Deployment", owner.namespace, owner.name)
    )
    watch: Watch | None = None
    decision: study.Decision | None = None
    scaled: scaling.Outcome | None = None
    conflicts: list[str] = []
    apply_failure: str | None = None
    events: list[Event] = []
    serving_spec = previous.serving_spec
    has_pod_monitor = False
    if spec is not None and not problems:
        problems += _privilege(spec, owner.namespace, kube)
        has_pod_monitor = kube.has_api(POD_MONITOR_API, "podmonitors")
        problems += _missing_apis(spec, kube, has_pod_monitor)
    if spec is not None and not problems:
        events += _image_notes(spec, meta, previous)
        conflicts = _conflicts(owner, spec, kube, deployment, has_pod_monitor)
        if conflicts:
            deployment = None  # someone else's: nothing of it is ours to report
    if spec is not None and not problems and not conflicts:
        served = render.served_name(owner, spec)
        watch = monitor(spec, previous, owner.namespace, served, now) if monitor else None
        _, active_hash = _active_config(deployment)
        decision = study.step(
            study.Context(
                owner=owner,
                spec=spec,
                previous=previous.tuning,
                now=now,
                kube=kube,
                active_hash=active_hash,
                serving_ready=_serving_ready(deployment),
                live=watch.live if watch else study.Live(),
                settings=settings or study.Settings(),
            )
        )
        serving = render.with_params(spec, decision.overlay)
        serving, scaled = _scale(
            owner, serving, previous, decision.tuning, watch, kube, deployment, now, events
        )
        deployment, rejected, apply_failure, applied = _apply_or_explain(
            owner,
            serving,
            kube,
            deployment,
            has_pod_monitor=has_pod_monitor,
            pool_served=_pool_served(previous),
            events=events,
        )
        problems += rejected
        deployment, apply_failure, serving_spec = _after_apply(
            owner,
            body,
            previous,
            kube,
            deployment,
            rejected=rejected,
            deployment_applied=applied,
            apply_failure=apply_failure,
            events=events,
        )
    elif problems and serving_spec:
        # The spec is invalid: the children are kept at the last good one, and repaired to it
        # when they are scaled, edited or deleted meanwhile.
        deployment, apply_failure = _keep_last_good(
            owner, serving_spec, previous, kube, deployment, events=events
        )

    active_args, active_hash = _active_config(deployment)
    observation = Observation(
        generation=int(meta.get("generation") or 0),
        # With the replica count scaling chose, which status reports.
        spec=spec.model_copy(update={"replicas": scaled.replicas}) if spec and scaled else spec,
        problems=problems,
        conflicts=conflicts,
        apply_failure=apply_failure,
        deployment=DeploymentState.from_object(deployment),
        active_args=active_args,
        config_hash=active_hash,
        tuning=decision.tuning if decision else previous.tuning,
        tuning_row=decision.row if decision else None,
        monitoring_rows=watch.rows if watch else [],
        slo=watch.slo if watch else previous.slo,
        gpu=watch.gpu if watch else previous.gpu,
        serving_spec=serving_spec,
        scaling=scaled.status if scaled else previous.scaling,
        scaling_row=scaled.row if scaled else None,
        selector=render.selector_string(owner, spec.engine.kind) if spec else previous.selector,
    )
    current = settle_figures(previous, compute_status(observation, previous, now), now)
    outcome = Reconciled(status=current, events=transitions(previous, current) + events, spec=spec)
    if decision is not None:
        outcome.events += decision.events
        outcome.progressed = decision.progressed
    outcome.seen = body
    if changed(previous, current):
        outcome.seen = kube.apply_status(owner.namespace, owner.name, to_patch(current))
        outcome.status_written = True
    if problems:
        outcome.invalid = "; ".join(problems)
    outcome.apply_failure = apply_failure
    return outcome


def _scale(  # noqa: PLR0917 - the reconcile's own state, passed through once
    owner: render.Owner,
    serving: LLMDeploymentSpec,
    previous: LLMDeploymentStatus,
    tuning: TuningStatus | None,
    watch: Watch | None,
    kube: KubeApi,
    deployment: dict[str, Any] | None,
    now: datetime,
    events: list[Event],
) -> tuple[LLMDeploymentSpec, scaling.Outcome]:
    """The serving spec with its replica count (`slotune.scaling`), decided from the demand
    monitoring read and the capacity per replica of the configuration about to serve; a
    change is added to `events` with its figures."""
    current = previous.scaling.desired_replicas if previous.scaling else None
    if current is None and deployment is not None:
        current = int(deployment["spec"].get("replicas", 1))  # a switch to Capacity keeps it
    capacity = scaling.serving_capacity(serving, tuning, render.config_hash(owner, serving))
    demand = watch.demand if watch else None
    floor = scaling.demand_floor(serving)
    if demand is not None and floor is not None:
        demand = max(demand, floor)
    blocked = (
        _unschedulable(owner, serving, kube, deployment)
        if serving.scaling.mode == "Capacity"
        else None
    )
    scale = scaling.decide(
        serving.scaling,
        spec_replicas=serving.replicas,
        current=current,
        demand=demand,
        capacity=capacity,
        headroom=serving.tuning.headroom,
        unschedulable=blocked,
        hold=scaling.study_holds(serving, tuning),
    )
    if scale.change is not None:
        out = scale.replicas > (scale.current or 0)
        events.append(Event("Normal", "ScaledOut" if out else "ScaledIn", scale.change))
    serving = serving.model_copy(update={"replicas": scale.replicas})
    scaled = scaling.outcome(
        serving, scale, demand=demand, capacity=capacity, previous=previous.scaling, now=now
    )
    return serving, scaled


def _unschedulable(
    owner: render.Owner,
    spec: LLMDeploymentSpec,
    kube: KubeApi,
    deployment: dict[str, Any] | None,
) -> str | None:
    """Why a serving pod cannot be placed (the scheduler's message), while the Deployment has
    fewer ready replicas than it asks for; pods are read only then. Only pods of this
    Deployment's ReplicaSets count."""
    if deployment is None or _serving_ready(deployment):
        return None
    prefix = f"{deployment['metadata']['name']}-"
    for pod in kube.list(
        "v1", "Pod", owner.namespace, render.selector_labels(owner, spec.engine.kind)
    ):
        owners = pod["metadata"].get("ownerReferences") or []
        if not any(
            r.get("kind") == "ReplicaSet" and r.get("name", "").startswith(prefix) for r in owners
        ):
            continue
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("reason") == "Unschedulable"
            ):
                return condition.get("message") or "Unschedulable"
    return None


def _after_apply(
    owner: render.Owner,
    body: dict[str, Any],
    previous: LLMDeploymentStatus,
    kube: KubeApi,
    deployment: dict[str, Any] | None,
    *,
    rejected: list[str],
    deployment_applied: bool,
    apply_failure: str | None,
    events: list[Event],
) -> tuple[dict[str, Any] | None, str | None, dict[str, Any] | None]:
    """The last good spec after an apply of the current one: the current one when the server
    took it whole; else the previous, whose children are applied again when the server refused
    the new ones as invalid (a Deployment deleted meanwhile comes back)."""
    serving_spec = previous.serving_spec
    if not rejected and apply_failure is None:
        return deployment, None, body.get("spec") or {}
    # Only when the new Deployment itself was refused is the last good one applied again (a
    # Deployment deleted meanwhile comes back): put back after a later child's refusal, the
    # new one would be rolled out and back on every reconcile.
    if rejected and serving_spec and not deployment_applied:
        deployment, apply_failure = _keep_last_good(
            owner, serving_spec, previous, kube, deployment, events=events
        )
    return deployment, apply_failure, serving_spec


def _image_notes(
    spec: LLMDeploymentSpec, meta: dict[str, Any], previous: LLMDeploymentStatus
) -> list[Event]:
    """A warning, once per generation of the spec, when the engine's flags were checked against
    a table of another version than the image runs (`slotune validate` says the same)."""
    if previous.observed_generation == meta.get("generation"):
        return []
    note = render.engine_of(spec).image_note(spec.engine.image)
    return [Event("Warning", "FlagsCheckedAgainstOtherVersion", note)] if note else []


def _missing_apis(spec: LLMDeploymentSpec, kube: KubeApi, has_pod_monitor: bool) -> list[str]:
    """What the spec switches on that needs a CRD the cluster does not serve, and what to
    install."""
    found = []
    if spec.monitoring.pod_monitor == "Enabled" and not has_pod_monitor:
        found.append(
            "spec.monitoring.podMonitor: Enabled, but the cluster has no PodMonitor CRD "
            "(monitoring.coreos.com/v1); install the Prometheus Operator or set Auto"
        )
    if spec.inference_pool.enabled and not kube.has_api(INFERENCE_POOL_API, "inferencepools"):
        found.append(
            "spec.inferencePool.enabled: true, but the cluster has no InferencePool CRD "
            "(inference.networking.k8s.io/v1); install the Gateway API Inference Extension's "
            "CRDs (v1.0 or later) or set enabled: false"
        )
    return found


def _privilege(spec: LLMDeploymentSpec, namespace: str, kube: KubeApi) -> list[str]:
    """The privilege the spec asks for that its namespace's Pod Security level does not allow
    (the namespace is read only when the spec asks for any)."""
    asked = privilege_asked(spec)
    if not asked:
        return []
    try:
        found = kube.get(Ref("v1", "Namespace", "", namespace)) or {}
    except KubeError as exc:
        if exc.status != 403:
            raise
        return [f"{what}: slotune cannot read namespace {namespace}'s Pod Security level "
                f"(grant it get on namespaces)" for what, _ in asked]  # fmt: skip
    level = ((found.get("metadata") or {}).get("labels") or {}).get(PSA_ENFORCE_LABEL)
    return privilege_problems(asked, namespace, level)


def _keep_last_good(
    owner: render.Owner,
    serving_spec: dict[str, Any],
    previous: LLMDeploymentStatus,
    kube: KubeApi,
    deployment: dict[str, Any] | None,
    *,
    events: list[Event],
) -> tuple[dict[str, Any] | None, str | None]:
    """Applies the children of the last good spec, with the tuned settings it was promoted
    with: the Deployment as it now is, and a failure to retry. Nothing is applied when that
    spec no longer passes the rules (an operator upgrade tightened one) or a child's name is
    taken by someone else's object."""
    last_good, problems = parse_spec(serving_spec, schema_problems)
    if last_good is None or problems or _privilege(last_good, owner.namespace, kube):
        return deployment, None
    has_pod_monitor = kube.has_api(POD_MONITOR_API, "podmonitors")
    if _conflicts(owner, last_good, kube, deployment, has_pod_monitor):
        return deployment, None
    serving = render.with_params(last_good, study.serving_overlay(previous.tuning))
    if (
        last_good.scaling.mode == "Capacity"
        and previous.scaling
        and previous.scaling.desired_replicas
    ):
        serving = serving.model_copy(update={"replicas": previous.scaling.desired_replicas})
    deployment, _, apply_failure, _ = _apply_or_explain(
        owner,
        serving,
        kube,
        deployment,
        has_pod_monitor=has_pod_monitor,
        pool_served=False,  # the last good spec is the one served: nothing switched off
        events=events,
    )
    return deployment, apply_failure


def _pool_served(previous: LLMDeploymentStatus) -> bool:
    """Whether the last spec applied whole had an InferencePool: only then can one of ours be
    left to remove, so a spec that never had one costs no request for it."""
    pool = (previous.serving_spec or {}).get("inferencePool") or {}
    return pool.get("enabled") is True


def _apply_or_explain(
    owner: render.Owner,
    spec: LLMDeploymentSpec,
    kube: KubeApi,
    deployment: dict[str, Any] | None,
    *,
    has_pod_monitor: bool,
    pool_served: bool,
    events: list[Event],
) -> tuple[dict[str, Any] | None, list[str], str | None, bool]:
    """Applies the children: the Deployment as it now is, the problems of a rendered object the
    server rejected as invalid (fixed by editing the spec), a failure to retry (any other
    error answer: a quota, a full Service range, a webhook, a 5xx), and whether the Deployment
    itself went in. Drift taken back is added to `events`."""
    try:
        applied = _apply_children(
            owner,
            spec,
            kube,
            deployment,
            has_pod_monitor=has_pod_monitor,
            pool_served=pool_served,
            events=events,
        )
    except ChildApplyError as failed:
        exc = failed.error
        if exc.rejected:
            # `failed.deployment` is None when the Deployment itself (the first child) was
            # refused; otherwise it went in and a later child was refused.
            refused = [f"the API server rejected a rendered object: {exc.message}"]
            return failed.deployment or deployment, refused, None, failed.deployment is not None
        if exc.status == 0:
            raise exc from None  # no API server to write a status to either
        return failed.deployment or deployment, [], str(failed), failed.deployment is not None
    return applied or deployment, [], None, True


def _apply_children(
    owner: render.Owner,
    spec: LLMDeploymentSpec,
    kube: KubeApi,
    live_deployment: dict[str, Any] | None,
    *,
    has_pod_monitor: bool,
    pool_served: bool,
    events: list[Event],
) -> dict[str, Any] | None:
    """Applies every child, after taking back what others added to the lists slotune renders
    whole, and removes those switched off (an InferencePool only when `pool_served`); returns
    the Deployment as the server now has it. Raises `ChildApplyError` for the first child the
    server answers with an error."""
    deployment: dict[str, Any] | None = None
    for child in render.render_children(owner, spec, pod_monitor_crd_present=has_pod_monitor):
        try:
            live = live_deployment if child["kind"] == "Deployment" else None
            if child["kind"] == "Service":
                live = kube.get(Ref.of(child))
            if live is not None:
                _take_back_drift(child, live, kube, events)
            applied = kube.apply(child)
        except KubeError as exc:
            raise ChildApplyError(child, exc, deployment) from exc
        if child["kind"] == "Deployment":
            deployment = applied
    switched_off = []
    if has_pod_monitor and not render.wants_pod_monitor(spec, has_pod_monitor):
        switched_off.append(Ref(POD_MONITOR_API, "PodMonitor", owner.namespace, owner.name))
    if pool_served and not spec.inference_pool.enabled:
        switched_off.append(Ref(INFERENCE_POOL_API, "InferencePool", owner.namespace, owner.name))
    for ref in switched_off:
        # Remove the one we made earlier, never one of someone else's.
        existing = kube.get(ref)
        if existing is not None and _owned_by(existing, owner):
            kube.delete(ref)
    return deployment


def _take_back_drift(
    child: dict[str, Any], live: dict[str, Any], kube: KubeApi, events: list[Event]
) -> None:
    """Removes the entries others added to a list slotune renders whole (a container, an env
    var, a Service port edited in place), which server-side apply would leave beside
    slotune's. A replacement that meets a newer version (409) is left to the next reconcile."""
    foreign = render.foreign_entries(child, live)
    if not foreign:
        return
    try:
        kube.replace(render.taken_back(child, live))
    except KubeError as exc:
        if exc.status == 409:
            return
        raise
    ref = Ref.of(child)
    events.append(
        Event(
            "Warning",
            "DriftRepaired",
            f"took back from {ref.kind} {ref.namespace}/{ref.name} what slotune does not render "
            f"there: {', '.join(foreign)}",
        )
    )


def _conflicts(
    owner: render.Owner,
    spec: LLMDeploymentSpec,
    kube: KubeApi,
    deployment: dict[str, Any] | None,
    has_pod_monitor: bool,
) -> list[str]:
    """The objects slotune would apply that exist and are not controlled by this
    LLMDeployment: another team's Service named like it, say. Server-side apply with force
    would take them over (and garbage collection would delete them with the LLMDeployment), so
    nothing is applied while any is there."""
    found = []
    children = [
        Ref.of(child)
        for child in render.render_children(owner, spec, pod_monitor_crd_present=has_pod_monitor)
    ]
    if spec.tuning.enabled:
        # The study's records: read only from a ConfigMap this LLMDeployment controls.
        children.append(Ref("v1", "ConfigMap", owner.namespace, render.child_name(owner, "trials")))
    for ref in children:
        existing = deployment if ref.kind == "Deployment" else kube.get(ref)
        if existing is None or _owned_by(existing, owner, controller=True):
            continue
        controller = next(
            (r for r in existing["metadata"].get("ownerReferences") or [] if r.get("controller")),
            None,
        )
        by = (
            f"controlled by {controller['kind']} {controller['name']}"
            if controller
            else "controlled by no LLMDeployment"
        )
        found.append(
            f"{ref.kind} {ref.namespace}/{ref.name} already exists and is {by}; slotune "
            "leaves it as it is: delete or rename it, or give this LLMDeployment another name"
        )
    return found


def _owned_by(obj: dict[str, Any], owner: render.Owner, *, controller: bool = False) -> bool:
    """Whether the object has an owner reference to this LLMDeployment (its controller one,
    with `controller`)."""
    references = obj.get("metadata", {}).get("ownerReferences") or []
    return any(
        ref.get("uid") == owner.uid and (ref.get("controller") or not controller)
        for ref in references
    )
