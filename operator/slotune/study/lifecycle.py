"""The study as a whole, around its trials: off (`disabled`), held while Prometheus is
unreachable (`held`), started (`start_new`, and again on a re-tune), and after it ended
(`after_study`: a recommendation promoted once `apply` turns Auto, or a re-tune).
"""

from __future__ import annotations

from slotune.models import ConditionType, TuningState, TuningStatus
from slotune.status import ConditionRow, Event
from slotune.study import trials
from slotune.study.context import Decision, StepContext, serving_overlay
from slotune.study.promote import promote


def disabled(ctx: StepContext) -> Decision:
    """Tuning off: the spec's own configuration serves and trial objects go."""
    previous = ctx.situation.previous
    if previous is None:  # never tuned: there is nothing to clean up
        return Decision(None, {}, None, why=ctx.why)
    ctx.delete_trial_objects(keep=None)
    tuning = previous.model_copy(update={"promoted": None, "current": None})
    if previous.promoted is not None:
        tuning.message = "tuning is disabled: the spec's own configuration serves"
    row: ConditionRow = (ConditionType.TUNING, "False", "Disabled", tuning.message or ctx.why)
    return Decision(tuning, {}, row, actions=ctx.actions, why=ctx.why)


def held(ctx: StepContext) -> Decision:
    """Prometheus is unreachable: nothing changes until it answers again."""
    previous = ctx.situation.previous
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
    overlay = serving_overlay(previous, ctx.spec.tuning.strategy)
    return Decision(previous, overlay, row, why=ctx.why)


def start_new(ctx: StepContext) -> Decision:
    """No study yet, or the spec changed: study 1, or the next, starts afresh."""
    previous = ctx.situation.previous
    reason = "Created" if previous is None else "SpecChanged"
    return start(ctx, previous, trials.spec_hash(ctx.spec), reason, keep_overlay=False)


def start(
    ctx: StepContext, previous: TuningStatus | None, wanted: str, reason: str, *, keep_overlay: bool
) -> Decision:
    number = (previous.study if previous else 0) + 1
    tuning = TuningStatus(
        state=TuningState.TUNING,
        study=number,
        reason=reason,
        spec_hash=wanted,
        started_at=ctx.now,
        max_trials=ctx.spec.tuning.max_trials,
        message=f"study {number} started ({reason})",
        promoted=previous.promoted if previous and keep_overlay else None,
    )
    ctx.delete_trial_objects(keep=None)
    ctx.save_records(number, [])
    ctx.events.append(Event("Normal", "TuningStarted", f"Study {number} started: {reason}"))
    return ctx.result(tuning, progressed=True)


def after_study(ctx: StepContext) -> Decision:
    """The study ended: a recommendation is promoted once `apply` is Auto, and a re-tune that
    is due starts the next study (keeping what serves)."""
    # No trial object outlives a study: each went when its trial was recorded, and the
    # study only ends once no trial is in flight. Nothing to list on every resync here.
    tuning, spec = ctx.tuning, ctx.spec
    if (
        tuning.state == TuningState.RECOMMENDED
        and spec.tuning.apply == "Auto"
        and tuning.recommendation is not None
    ):
        kept = ctx.records(tuning.study)
        chosen = next((r for r in kept if r.number == tuning.recommendation.get("trial")), None)
        # A recommendation of several replicas is whole only where slotune sizes them.
        whole = "replicas" not in tuning.recommendation or spec.scaling.mode == "Capacity"
        if chosen is not None and whole:
            return promote(ctx, tuning, chosen)
    retune = ctx.situation.live.retune
    if retune is not None:
        wanted = tuning.spec_hash or trials.spec_hash(spec)
        return start(ctx, tuning, wanted, retune, keep_overlay=True)
    return ctx.result(tuning)
