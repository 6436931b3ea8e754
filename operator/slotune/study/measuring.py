"""A trial's last steps: its load Job measures the engine (`measuring` on a canary pod,
`measuring_in_place` on the serving pods; either way `follow_load` reads the Job), and once
the trial is recorded its objects go (`cleaning_up`) before the next is planned.
"""

from __future__ import annotations

from slotune import render
from slotune.models import CurrentTrial, TuningStatus
from slotune.status import Event
from slotune.study import trials
from slotune.study.context import Decision, Delete, StepContext
from slotune.study.outcomes import conflict, failed, record
from slotune.tuner.loop import Launch
from slotune.tuner.records import TrialRecord, TrialState

MAX_VOIDED = 2
"""Load Jobs of one trial discarded (completed through a pod they did not make) before the trial
is recorded as failed rather than measured again."""


def measuring(
    ctx: StepContext, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
) -> Decision:
    """Canary: the trial's own pod must keep serving while its load Job runs."""
    pod_name = render.child_name(ctx.owner, "trial", tuning.study, current.number)
    engine = trials.PodState.of(
        ctx.seen.trial_pod(pod_name), owner_uid=ctx.owner.uid, made=current.pod_uid
    )
    if engine.phase == "Conflict":
        return conflict(ctx, tuning, current, engine.detail)
    if engine.phase in ("Failed", "Gone"):
        cause = "the engine stopped while it was measured"
        if engine.detail:
            cause += f": {engine.detail}"
        return failed(ctx, tuning, current, records, cause, kind=engine.failure_kind or "Crash")
    return follow_load(ctx, tuning, current, records)


def measuring_in_place(
    ctx: StepContext, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
) -> Decision:
    """InPlace: the serving pods running the trial must keep serving while it is measured."""
    if failure := trials.first_failure(ctx.seen.serving_pods(current.config_hash)):
        return failed(ctx, tuning, current, records, failure, kind="Crash")
    return follow_load(ctx, tuning, current, records)


def follow_load(
    ctx: StepContext, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
) -> Decision:
    """The load Job's course: running (wait), gone (launched again), failed, or done with the
    measurement (recorded, unless the GPUs were throttled meanwhile)."""
    job_name = render.child_name(ctx.owner, "load", tuning.study, current.number)
    job, pods = ctx.seen.load_job(job_name)
    load = trials.LoadState.of(job, pods, owner_uid=ctx.owner.uid, made=current.job_uid)
    if load.phase == "Conflict":
        return conflict(ctx, tuning, current, load.detail)
    if job is not None and load.phase != "Gone":
        current.job_uid = current.job_uid or job["metadata"].get("uid")
    if load.phase == "Void":
        return voided(ctx, tuning, current, records, load.detail)
    if load.phase == "Gone":
        current.step = "Launching"  # measured again, once the engine is (still) ready
        return ctx.result(tuning, progressed=True)
    if load.phase == "Failed":
        return failed(ctx, tuning, current, records, load.detail, kind="LoadFailed")
    if load.phase == "Done":
        if ctx.situation.live.throttled:
            # A throttled GPU measures slower than it serves: not trusted, measured again.
            ctx.delete(Delete("batch/v1", "Job", ctx.owner.namespace, job_name))
            current.note = "measurement discarded: the GPUs were throttled"
            ctx.events.append(
                Event(
                    "Warning",
                    "TrialDiscarded",
                    f"Trial {current.number}: measurement discarded, the GPUs were throttled",
                )
            )
            return ctx.result(tuning)
        launch = Launch(TrialState.MEASURED, measurement=load.measurement)
        return record(ctx, tuning, current, records, launch)
    return ctx.result(tuning)


def voided(
    ctx: StepContext,
    tuning: TuningStatus,
    current: CurrentTrial,
    records: list[TrialRecord],
    detail: str,
) -> Decision:
    """The load Job completed through a pod it did not make: deleted, and the trial
    measured again by a new one; a trial whose Jobs keep doing so is recorded as failed."""
    if current.voided >= MAX_VOIDED:  # not a forgery now and then: this cluster's way
        cause = (
            f"{detail}, {current.voided + 1} times: a webhook that changes the load "
            "pod (its image, arguments, environment or mounts) would do that"
        )
        return failed(ctx, tuning, current, records, cause, kind="LoadFailed")
    name = render.child_name(ctx.owner, "load", tuning.study, current.number)
    ctx.delete(Delete("batch/v1", "Job", ctx.owner.namespace, name))
    if current.note != detail:
        current.voided += 1
        ctx.events.append(
            Event(
                "Warning",
                "TrialDiscarded",
                f"Trial {current.number}: measurement discarded, {detail}",
            )
        )
    current.note = detail
    return ctx.result(tuning)  # once it is gone, the trial is measured again


def cleaning_up(
    ctx: StepContext, tuning: TuningStatus, current: CurrentTrial, records: list[TrialRecord]
) -> Decision:
    """The trial is recorded; the next is planned once its objects are gone."""
    if ctx.trial_objects_left(tuning.study, current.number):
        # Deleted by this step (look again at once), or still terminating (wait).
        deleted = any(isinstance(action, Delete) for action in ctx.actions)
        return ctx.result(tuning, progressed=deleted)
    tuning.current = None
    return ctx.result(tuning, progressed=True)
