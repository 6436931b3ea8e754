"""The tuning study's decisions: a pure transition function over plain data, read as two
tables.

`decide(situation, observation)` takes the spec, the study's place in `status.tuning`, what
on-call says now and what the API holds (an `Observation`: the trial records, the trial pod
and load Job, the serving pods), and returns the new `status.tuning`, the actions to take
(apply or delete objects, keep records) and the events to emit. It does no I/O: `observe`
gathers the observation and `act` performs the actions (`slotune.study.step` runs the
three), so every row below is tested from plain data.

`STUDY` picks what kind of step this is: the first row whose guard holds decides. A study with
trials under way goes on by its trial's step and the strategy (`TRIAL_STEPS`), or plans the
next trial when none is in flight. Each row is a plain function of the step's `StepContext`;
its `when` is shown: in `Decision.why` (which `slotune.study.step` logs) and as the Tuning
condition's message where status has none.

A trial (strategy Canary) runs on its own pod, outside the serving Service, and is measured by
a load Job running the operator's image. The study plans its trials with the same planner as
`slotune tune --local`. When it ends, the winner is promoted to the serving Deployment (a
surge rollout: no serving capacity is lost), checked, and rolled back to the last good
configuration if it fails its readiness or SLO check; with `apply: Recommend` it is only
written to status, with a patch of the spec that would make it permanent.

Strategy InPlace (no spare GPU for a canary) rolls the serving Deployment itself to each
trial's configuration and measures it there; the last good configuration comes back after the
study unless a winner is promoted.

Where a row's work lives: `lifecycle` (off, held, started, ended), `promote` (the winner
recommended, promoted, verified or rolled back), `launch` (planned, engine started, load
started), `measuring` (measured, cleaned up), `outcomes` (recorded, or held by a conflict);
`context` holds the plain data in and out and the step's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from slotune.models import CurrentTrial, TuningState, TuningStatus
from slotune.study import trials
from slotune.study.context import (
    Action,
    Apply,
    Decision,
    Delete,
    Live,
    Observation,
    Quarantine,
    Settings,
    Situation,
    StepContext,
    serving_overlay,
)
from slotune.study.launch import launching, launching_in_place, plan
from slotune.study.lifecycle import after_study, disabled, held, start_new
from slotune.study.measuring import cleaning_up, measuring, measuring_in_place
from slotune.study.promote import verify
from slotune.tuner.records import TrialRecord

__all__ = [
    "STUDY",
    "TRIAL_STEPS",
    "Action",
    "Apply",
    "Decision",
    "Delete",
    "Live",
    "Observation",
    "Quarantine",
    "Settings",
    "Situation",
    "decide",
    "serving_overlay",
]

TERMINAL = {TuningState.COMPLETED, TuningState.RECOMMENDED, TuningState.ROLLED_BACK}


def _tuning_off(ctx: StepContext) -> bool:
    return not ctx.spec.tuning.enabled or ctx.spec.slo is None


def _held(ctx: StepContext) -> bool:
    return ctx.situation.live.hold


def _new_study_due(ctx: StepContext) -> bool:
    previous = ctx.situation.previous
    return previous is None or previous.spec_hash != trials.spec_hash(ctx.spec)


def _ended(ctx: StepContext) -> bool:
    return ctx.tuning.state in TERMINAL


def _promoting(ctx: StepContext) -> bool:
    return ctx.tuning.state == TuningState.PROMOTING


def _always(ctx: StepContext) -> bool:
    return True


def advance(ctx: StepContext) -> Decision:
    """A study with trials: every trial object but the current trial's goes, then the
    current trial's step and the strategy decide (`TRIAL_STEPS`); with no trial in flight,
    the next is planned."""
    records = ctx.records(ctx.tuning.study)
    tuning = trials.summarize(records, ctx.tuning)
    current = tuning.current
    ctx.delete_trial_objects(
        keep=None if current is None or current.step == "CleaningUp" else current.number,
        study=tuning.study,
    )
    if current is None:
        ctx.whens.append(PLANNING)
        return plan(ctx, tuning, records)
    step = TRIAL_STEPS[(current.step, ctx.spec.tuning.strategy)]
    ctx.whens.append(step.when)
    return step.then(ctx, tuning, current, records)


@dataclass(frozen=True)
class Transition:
    """When `guard` holds (the first one, in table order), `then` decides the step."""

    when: str
    guard: Callable[[StepContext], bool]
    then: Callable[[StepContext], Decision]


# What kind of step this is. Order carries meaning: a hold beats a spec change (no new study
# starts while Prometheus, which it would be judged by, is unreachable), and a spec change
# beats everything a study in progress would do.
STUDY: tuple[Transition, ...] = (
    Transition("tuning is off, or the spec has no SLO", _tuning_off, disabled),
    Transition("Prometheus is unreachable", _held, held),
    Transition("no study yet, or the spec changed", _new_study_due, start_new),
    Transition("the study ended", _ended, after_study),
    Transition("a winner is being promoted", _promoting, verify),
    Transition("trials are under way", _always, advance),
)

TrialStepName = Literal["Launching", "Measuring", "CleaningUp"]
Strategy = Literal["Canary", "InPlace"]


@dataclass(frozen=True)
class TrialStep:
    """What a trial's step is (`when`, shown) and the function that decides it."""

    when: str
    then: Callable[[StepContext, TuningStatus, CurrentTrial, list[TrialRecord]], Decision]


PLANNING = "no trial is in flight: the next is planned"

# A trial in flight goes on by its step and the strategy: Launching (its engine starts: a
# canary pod, or the serving Deployment rolled to the trial), Measuring (its load Job runs
# against that engine), CleaningUp (recorded; its objects go).
TRIAL_STEPS: dict[tuple[TrialStepName, Strategy], TrialStep] = {
    ("Launching", "Canary"): TrialStep("the trial's canary pod is starting", launching),
    ("Launching", "InPlace"): TrialStep(
        "the serving Deployment is rolling out the trial", launching_in_place
    ),
    ("Measuring", "Canary"): TrialStep("the load Job is measuring the canary pod", measuring),
    ("Measuring", "InPlace"): TrialStep(
        "the load Job is measuring the serving pods", measuring_in_place
    ),
    ("CleaningUp", "Canary"): TrialStep("the trial is recorded; its objects go", cleaning_up),
    ("CleaningUp", "InPlace"): TrialStep("the trial is recorded; its objects go", cleaning_up),
}


def decide(situation: Situation, observation: Observation) -> Decision:
    """One step of the LLMDeployment's study; see the module docstring."""
    ctx = StepContext.of(situation, observation)
    transition = next(t for t in STUDY if t.guard(ctx))
    ctx.whens.append(transition.when)
    return transition.then(ctx)
