"""The two ways a trial step ends short of its next step, shared by launching and measuring:
the trial is over and its record is kept (`record`), or someone else's object sits at one of
its names and it waits (`conflict`).

A record is scored by the pure `slotune.tuner.loop.record_of`: no Optuna study is built for
it (only planning the next trial needs one, `slotune.study.launch.plan`).
"""

from __future__ import annotations

from slotune.models import ConditionType, CurrentTrial, TuningStatus
from slotune.status import Event
from slotune.study import trials
from slotune.study.context import Decision, StepContext, describe
from slotune.tuner import loop
from slotune.tuner.loop import Launch, NextTrial
from slotune.tuner.records import TrialRecord, TrialState


def planned(current: CurrentTrial) -> NextTrial:
    """The planned trial a trial in flight was started as."""
    return NextTrial(
        number=current.number,
        params=current.params,
        seed=current.seed,
        phase=current.phase,
        label=current.label,
        of_trial=current.of_trial,
    )


def record(
    ctx: StepContext,
    tuning: TuningStatus,
    current: CurrentTrial,
    records: list[TrialRecord],
    launch: Launch,
) -> Decision:
    """Keeps the trial's record (once, whatever restarts happen) and cleans up after it."""
    if not any(r.number == current.number for r in records):
        seconds = (ctx.now - current.started_at).total_seconds()
        found = loop.record_of(ctx.seed_spec, planned(current), launch, seconds)
        records = [*records, found]
        ctx.save_records(tuning.study, records)
        ctx.events.append(trial_event(found))
    tuning = trials.summarize(records, tuning)
    current.step = "CleaningUp"
    current.since = ctx.now
    tuning.current = current
    ctx.delete_trial_objects(keep=None, study=tuning.study)
    return ctx.result(tuning, progressed=True)


def failed(
    ctx: StepContext,
    tuning: TuningStatus,
    current: CurrentTrial,
    records: list[TrialRecord],
    cause: str,
    *,
    kind: str,
) -> Decision:
    """Records the trial as failed, for `cause` (a failure of `kind`)."""
    launch = Launch(TrialState.FAILED, cause=cause, failure_kind=kind)
    return record(ctx, tuning, current, records, launch)


def conflict(
    ctx: StepContext, tuning: TuningStatus, current: CurrentTrial, detail: str
) -> Decision:
    """Someone else's object sits at the trial's name: the trial waits, and says so. It is
    never adopted, read or deleted; once it is gone the trial goes on."""
    if current.note != detail:
        ctx.events.append(Event("Warning", "ChildConflict", f"Trial {current.number}: {detail}"))
    current.note = detail
    decision = ctx.result(tuning)
    decision.row = (
        ConditionType.TUNING,
        "True",
        "ChildConflict",
        f"trial {current.number}: {detail}",
    )
    return decision


def trial_event(found: TrialRecord) -> Event:
    m = found.measurement
    if m is None:
        return Event(
            "Warning" if found.state == TrialState.FAILED else "Normal",
            f"Trial{found.state}",
            f"Trial {found.number} ({describe(found.params)}): {found.state}: "
            + (found.cause or "")[:400],
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
        f"Trial {found.number} ({describe(found.params)}) {verdict}: {capacity}; at the "
        f"target rate {figures}",
    )
