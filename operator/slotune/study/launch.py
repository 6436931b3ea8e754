"""A trial's first steps: planned (`plan`), its engine started (`launching` on a canary pod,
`launching_in_place` on the serving Deployment), and its load Job started once that engine
is ready (`start_load`).

Only `plan` builds an Optuna study (the `Planner`, once a step, from the records); what a
measurement is asked comes from the pure `slotune.tuner.loop.measure_request`.
"""

from __future__ import annotations

from slotune import render
from slotune.engine.knobs import lossy_settings
from slotune.models import CurrentTrial, TuningStatus
from slotune.study import promote, trials
from slotune.study.context import Apply, Decision, StepContext, describe, serving_overlay
from slotune.study.outcomes import conflict, failed, planned, record
from slotune.tuner import loop
from slotune.tuner.loop import Finished, Launch, Planner
from slotune.tuner.records import TrialRecord, TrialState


def plan(ctx: StepContext, tuning: TuningStatus, records: list[TrialRecord]) -> Decision:
    """No trial in flight: the planner picks the next one, or ends the study."""
    planner = Planner(
        ctx.seed_spec,
        platform=ctx.platform,
        model=render.model_path(ctx.spec),
        served_name=render.served_name(ctx.owner, ctx.spec),
        records=records,
    )
    planned_next = planner.plan()
    if planner.rejected:  # configurations that break the engine's rules: never launched
        records = [*records, *planner.rejected]
        ctx.save_records(tuning.study, records)
        tuning = trials.summarize(records, tuning)
    if isinstance(planned_next, Finished):
        return promote.finish(ctx, tuning, planned_next, records)
    if ctx.workload() is None:
        tuning.message = "waiting for live traffic to shape the trial workload"
        return ctx.result(tuning)
    tuned = render.with_params(ctx.spec, planned_next.params)
    tuning.current = CurrentTrial(
        number=planned_next.number,
        phase=planned_next.phase,
        label=planned_next.label,
        params=planned_next.params,
        seed=planned_next.seed,
        of_trial=planned_next.of_trial,
        step="Launching",
        since=ctx.now,
        started_at=ctx.now,
        config_hash=render.config_hash(ctx.owner, tuned),
    )
    what = "re-measuring" if planned_next.phase == "finalist" else "trying"
    tuning.message = f"trial {planned_next.number}: {what} {describe(planned_next.params)}"
    return ctx.result(tuning, progressed=True)


def launching(
    ctx: StepContext, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
) -> Decision:
    """Canary: the trial's own pod (behind its own NetworkPolicy) starts its engine."""
    owner = ctx.owner
    name = render.child_name(owner, "trial", tuning.study, current.number)
    pod = ctx.seen.trial_pod(name)
    if pod is None:
        policy = ctx.seen.trial_policy(name)
        if policy is not None and not trials.controlled_by(policy, owner.uid):
            # Applied, it would take the fields of someone else's policy over.
            detail = trials.not_ours({"kind": "NetworkPolicy", **policy})
            return conflict(ctx, tuning, current, detail)
        # The policy first: the engine is never reachable by any pod but its load Job's.
        ctx.actions.append(
            Apply(render.render_trial_network_policy(owner, ctx.spec, tuning.study, current.number))
        )
        ctx.actions.append(
            Apply(
                render.render_trial_pod(
                    owner, ctx.spec, current.params, tuning.study, current.number
                )
            )
        )
        current.pod = name
        return ctx.result(tuning)
    waited = (ctx.now - current.since).total_seconds()
    state = trials.PodState.of(
        pod, startup_seconds=waited, owner_uid=owner.uid, made=current.pod_uid
    )
    if state.phase == "Conflict":
        return conflict(ctx, tuning, current, state.detail)
    current.pod_uid = current.pod_uid or pod["metadata"].get("uid")
    if state.phase == "Ready" and state.ip:
        # The serving pods are apart from a canary: they can be its quality reference.
        url = f"http://{state.ip}:{ctx.port}"
        return start_load(ctx, tuning, current, records, url, reference=True)
    if state.phase == "Failed":
        launch = Launch(TrialState.FAILED, cause=state.detail, failure_kind=state.failure_kind)
        return record(ctx, tuning, current, records, launch)
    if state.phase == "Blocked":
        current.note = state.detail
        if state.detail.startswith("Unschedulable"):
            current.note += " (no room for a canary: strategy InPlace tunes without one)"
            return ctx.result(tuning)
    if waited > ctx.situation.settings.startup_seconds:
        cause = f"the engine was not ready after {waited:.0f} s"
        if current.note:
            cause += f" ({current.note})"
        return failed(ctx, tuning, current, records, cause, kind="Timeout")
    return ctx.result(tuning)


def launching_in_place(
    ctx: StepContext, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
) -> Decision:
    """InPlace: the serving Deployment runs the trial (`serving_overlay`); wait for its
    rollout."""
    waited = (ctx.now - current.since).total_seconds()
    pods = ctx.seen.serving_pods(current.config_hash)
    if failure := trials.first_failure(pods):
        return failed(ctx, tuning, current, records, failure, kind="Crash")
    situation = ctx.situation
    if situation.active_hash == current.config_hash and situation.serving_ready:
        states = [trials.PodState.of(pod) for pod in pods]
        ip = next((state.ip for state in states if state.phase == "Ready"), None)
        if ip:
            url = f"http://{ip}:{ctx.port}"
            return start_load(ctx, tuning, current, records, url, reference=False)
    if waited > situation.settings.startup_seconds:
        cause = f"the rollout was not ready after {waited:.0f} s"
        return failed(ctx, tuning, current, records, cause, kind="Timeout")
    return ctx.result(tuning)


def start_load(
    ctx: StepContext,
    tuning: TuningStatus,
    current: CurrentTrial,
    records: list[TrialRecord],
    url: str,
    *,
    reference: bool,
) -> Decision:
    """The engine at `url` is ready: its load Job starts. With `reference`, the serving pods,
    where they are lossless, are the quality gate's reference."""
    workload = ctx.workload()
    if workload is None or workload.request_rate is None:
        current.note = "waiting for live traffic to shape the trial workload"
        return ctx.result(tuning)
    owner, spec = ctx.owner, ctx.spec
    name = render.child_name(owner, "load", tuning.study, current.number)
    existing, _ = ctx.seen.load_job(name)
    if existing is not None and not trials.controlled_by(existing, owner.uid):
        return conflict(ctx, tuning, current, trials.not_ours({"kind": "Job", **existing}))
    request = loop.measure_request(
        ctx.seed_spec, ctx.platform, records, planned(current), rate=workload.request_rate
    )
    tuning.target_rate = round(request.target_rate, 4)
    knobs = render.engine_of(spec).knobs
    gated = spec.tuning.quality.allow_lossy and bool(
        lossy_settings(knobs, loop.merged(ctx.seed_spec, current.params))
    )
    serving = loop.merged(ctx.seed_spec, serving_overlay(tuning))
    job = render.render_load_job(
        owner,
        spec,
        image=ctx.situation.settings.load_image,
        url=url,
        workload=workload,
        request=request,
        study=tuning.study,
        trial=current.number,
        gated=gated,
        reference_url=(
            render.service_url(owner, spec)
            if reference and not lossy_settings(knobs, serving)
            else None
        ),
    )
    ctx.actions.append(Apply(job))
    current.job = job["metadata"]["name"]
    current.job_uid = None  # a new Job: its UID comes with the apply (`slotune.study.step`)
    current.step = "Measuring"
    current.since = ctx.now
    current.note = None
    return ctx.result(tuning)
