"""The end of a study: its winner recommended (`apply: Recommend`) or promoted to the serving
Deployment (`promote`, a surge rollout), then checked (`verify`: ready, then the SLO over one
window on live traffic) and rolled back to the last good configuration if it fails the check.
"""

from __future__ import annotations

from datetime import timedelta

from slotune import models, render
from slotune.measure.capacity import Capacity
from slotune.models import ReplicaCapacity, TunedConfig, TuningState, TuningStatus
from slotune.status import Event
from slotune.study import trials
from slotune.study.context import Decision, StepContext, describe, serving_overlay
from slotune.tuner.loop import Finished, versus_defaults
from slotune.tuner.records import TrialRecord


def finish(
    ctx: StepContext, tuning: TuningStatus, finished: Finished, records: list[TrialRecord]
) -> Decision:
    """The planner ended the study: its winner is recommended or promoted."""
    spec = ctx.spec
    tuning.finished_at = ctx.now
    winner = finished.winner
    done = f"{tuning.trials_completed} trials ({finished.stopped_because})"
    found = (
        versus_defaults(records, finished.confirmed)
        if winner is not None and finished.confirmed is not None and winner.label != "vllm-defaults"
        else None
    )
    tuning.versus_defaults = found.describe() if found is not None else None
    if winner is not None and finished.confirmed is not None:
        tuning.replica_capacity = replica_capacity(ctx, tuning, winner, finished.confirmed)
    if winner is None:
        return no_winner(ctx, tuning, finished, done)
    if spec.tuning.apply == "Recommend":
        tuning.state = TuningState.RECOMMENDED
        tuning.recommendation = trials.recommendation(spec, winner, ctx.now)
        tuning.message = (
            f"recommends trial {winner.number} ({describe(winner.params)}) after {done}; "
            "apply the patch in status.tuning.recommendation or set apply: Auto"
        )
        ctx.events.append(Event("Normal", "Recommended", tuning.message))
        return ctx.result(tuning)
    return promote(ctx, tuning, winner, done=done)


def no_winner(ctx: StepContext, tuning: TuningStatus, finished: Finished, done: str) -> Decision:
    """No configuration carries the target on one replica. When the best one was
    re-measured, N replicas of it do: Recommend says so with a patch; Auto promotes it when
    Capacity scaling sizes the replicas; otherwise serving stays as it is."""
    spec = ctx.spec
    tuning.state = TuningState.COMPLETED
    tuning.message = f"no configuration met the SLO on one replica in {done}"
    replicas = finished.replicas
    if replicas is None or finished.best is None or finished.confirmed is None:
        tuning.message += "; serving is unchanged"
        ctx.events.append(Event("Warning", "NoConfigurationMetSLO", tuning.message))
        return ctx.result(tuning)
    best = replicas.record
    tuning.replica_capacity = replica_capacity(ctx, tuning, best, replicas.capacity)
    gpus = replicas.count * spec.resources.gpus
    tuning.message += (
        f"; the most any carries is {finished.confirmed.describe()} (trial "
        f"{finished.best.number}); {replicas.count} replicas ({gpus} GPUs) of trial "
        f"{best.number} ({describe(best.params)}, {replicas.capacity.rate:.3g} req/s each) "
        f"carry {tuning.target_rate or 0:.3g} req/s"
    )
    tuning.recommendation = trials.recommendation(spec, best, ctx.now, replicas=replicas.count)
    if spec.tuning.apply == "Auto" and spec.scaling.mode == "Capacity":
        ctx.events.append(Event("Warning", "NoConfigurationMetSLO", tuning.message))
        return promote(ctx, tuning, best, done=done)
    if spec.tuning.apply == "Recommend":
        tuning.state = TuningState.RECOMMENDED
        tuning.message += "; apply the patch in status.tuning.recommendation"
    else:
        tuning.message += (
            "; serving is unchanged: set scaling.mode: Capacity to let slotune size the "
            "replicas, or apply the patch in status.tuning.recommendation"
        )
    ctx.events.append(Event("Warning", "NoConfigurationMetSLO", tuning.message))
    return ctx.result(tuning)


def replica_capacity(
    ctx: StepContext, tuning: TuningStatus, found: TrialRecord, confirmed: Capacity
) -> ReplicaCapacity:
    low, high = confirmed.interval
    return ReplicaCapacity(
        hash=render.config_hash(ctx.owner, render.with_params(ctx.spec, found.params)),
        trial=found.number,
        study=tuning.study,
        rate=round(confirmed.rate, 4),
        low=round(low, 4),
        high=round(high, 4) if high is not None else None,
    )


def promote(
    ctx: StepContext, tuning: TuningStatus, winner: TrialRecord, *, done: str = ""
) -> Decision:
    owner, spec, now = ctx.owner, ctx.spec, ctx.now
    serving_now = render.config_hash(owner, render.with_params(spec, serving_overlay(tuning)))
    target = render.config_hash(owner, render.with_params(spec, winner.params))
    if target == serving_now:
        tuning.state = TuningState.COMPLETED
        tuning.message = (
            f"the serving configuration is already the best (trial {winner.number})"
            + (f" after {done}" if done else "")
        )
        return ctx.result(tuning)
    tuning.last_good = tuning.promoted or TunedConfig(params={}, hash=serving_now, at=now)
    tuning.promoted = TunedConfig(
        params=winner.params, trial=winner.number, study=tuning.study, hash=target, at=now
    )
    tuning.state = TuningState.PROMOTING
    tuning.verify_since = None
    tuning.message = f"promoting trial {winner.number} ({describe(winner.params)})"
    ctx.events.append(Event("Normal", "Promoting", tuning.message.capitalize()))
    return ctx.result(tuning, progressed=True)


def verify(ctx: StepContext) -> Decision:
    """The promoted configuration must become ready, then hold the SLO over one window."""
    tuning, situation, now = ctx.tuning, ctx.situation, ctx.now
    promoted = tuning.promoted
    if promoted is None or promoted.at is None:  # nothing to check (status edited by hand)
        tuning.state = TuningState.COMPLETED
        return ctx.result(tuning)
    if failure := trials.first_failure(ctx.seen.serving_pods(promoted.hash)):
        return roll_back(ctx, tuning, f"its pods failed: {failure}")
    waited = (now - promoted.at).total_seconds()
    rolled = situation.active_hash == promoted.hash and situation.serving_ready
    if not rolled:
        if waited > situation.settings.startup_seconds:
            return roll_back(ctx, tuning, f"it was not ready after {waited:.0f} s")
        return ctx.result(tuning)
    if tuning.verify_since is None:
        tuning.verify_since = now
    window = timedelta(seconds=models.seconds(ctx.spec.slo.window if ctx.spec.slo else "5m"))
    live = situation.live
    judged = (
        live.slo_measured_at is not None and live.slo_measured_at >= tuning.verify_since + window
    )
    if judged and live.slo_met is False:
        return roll_back(ctx, tuning, f"it missed the SLO: {live.slo_detail}")
    if judged or now >= tuning.verify_since + window:
        verdict = (
            "met the SLO on live traffic"
            if judged and live.slo_met
            else ("ready; the SLO had no live traffic to judge")
        )
        tuning.state = TuningState.COMPLETED
        tuning.message = f"promoted trial {promoted.trial}: {verdict}"
        ctx.events.append(Event("Normal", "Promoted", tuning.message.capitalize()))
        return ctx.result(tuning)
    tuning.message = f"promoted trial {promoted.trial} is ready; checking the SLO"
    return ctx.result(tuning)


def roll_back(ctx: StepContext, tuning: TuningStatus, why: str) -> Decision:
    promoted = tuning.promoted or TunedConfig()
    tuning.promoted = tuning.last_good if tuning.last_good and tuning.last_good.params else None
    tuning.last_good = None
    tuning.state = TuningState.ROLLED_BACK
    tuning.message = (
        f"rolled back: promoted trial {promoted.trial} ({describe(promoted.params)}) "
        f"failed its check, {why}"
    )
    ctx.events.append(Event("Warning", "RolledBack", tuning.message.capitalize()))
    return ctx.result(tuning, progressed=True)
