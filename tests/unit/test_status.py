"""Status and conditions from observations, with an injected clock."""

from datetime import UTC, datetime, timedelta

from slotune import models
from slotune.status import (
    CONDITION_MESSAGE_LIMIT,
    FIGURES_REFRESH,
    SUMMARY_LIMIT,
    DeploymentState,
    Observation,
    clip,
    compute_status,
    settle_figures,
    transitions,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC = models.LLMDeploymentSpec.model_validate(
    {
        "model": {"name": "m"},
        "replicas": 2,
        "slo": {"ttft": {"maxSeconds": 2}},
        "tuning": {"enabled": True, "maxTrials": 12},
    }
)


def observe(ready: int, generation: int = 1, problems: list[str] | None = None) -> Observation:
    return Observation(
        generation=generation,
        spec=SPEC,
        problems=problems or [],
        deployment=DeploymentState(exists=True, desired=2, ready=ready, updated=2),
        active_args=["--model", "m"],
        config_hash="abc",
    )


def cond(status: models.LLMDeploymentStatus, type_: str) -> models.Condition:
    found = status.condition(type_)
    assert found is not None
    return found


def test_ready_flip_moves_transition_time_and_emits_one_event() -> None:
    empty = models.LLMDeploymentStatus()
    s1 = compute_status(observe(ready=1), empty, T0)
    assert s1.phase == models.Phase.DEPLOYING
    assert cond(s1, "Ready").status == "False"
    assert s1.ready == "1/2"

    # Same state later: nothing moves, nothing to report.
    s2 = compute_status(observe(ready=1), s1, T0 + timedelta(minutes=1))
    assert cond(s2, "Ready").last_transition_time == T0
    assert transitions(s1, s2) == []

    s3 = compute_status(observe(ready=2), s2, T0 + timedelta(minutes=2))
    assert s3.phase == models.Phase.READY
    assert cond(s3, "Ready").last_transition_time == T0 + timedelta(minutes=2)
    reasons = [e.reason for e in transitions(s2, s3)]
    assert "ReadyTrue" in reasons


def test_message_change_alone_keeps_transition_time() -> None:
    s1 = compute_status(observe(ready=0), models.LLMDeploymentStatus(), T0)
    s2 = compute_status(observe(ready=1), s1, T0 + timedelta(minutes=1))
    ready = cond(s2, "Ready")
    assert ready.message == "1 of 2 replicas ready"
    assert ready.last_transition_time == T0


def test_conditions_carry_the_observed_generation() -> None:
    s = compute_status(observe(ready=2, generation=7), models.LLMDeploymentStatus(), T0)
    assert s.observed_generation == 7
    assert {c.observed_generation for c in s.conditions} == {7}


def test_invalid_spec_says_what_to_fix_and_keeps_the_last_good_config() -> None:
    good = compute_status(observe(ready=2), models.LLMDeploymentStatus(), T0)
    bad = compute_status(
        observe(ready=2, generation=2, problems=["spec.engine.extraArgs[0]: --swap-space ..."]),
        good,
        T0 + timedelta(minutes=1),
    )
    assert bad.phase == models.Phase.INVALID
    ready = cond(bad, "Ready")
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert "--swap-space" in ready.message
    assert bad.active_config == good.active_config
    assert bad.ready == "2/2"
    kinds = {(e.type, e.reason) for e in transitions(good, bad)}
    assert ("Warning", "ReadyFalse") in kinds
    assert ("Warning", "DegradedTrue") in kinds


def test_an_object_in_a_childs_place_is_named_and_nothing_is_claimed_of_it() -> None:
    conflict = "Service team/api already exists and is controlled by no LLMDeployment; ..."
    observation = Observation(
        generation=1,
        spec=SPEC,
        problems=[],
        conflicts=[conflict],
        deployment=DeploymentState(exists=False),
        active_args=[],
        config_hash="",
    )
    status = compute_status(observation, models.LLMDeploymentStatus(), T0)
    assert status.phase == models.Phase.DEGRADED
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason, ready.message) == ("False", "ChildConflict", conflict)
    assert status.message == f"Not deployed: {conflict}"
    kinds = {(e.type, e.reason) for e in transitions(models.LLMDeploymentStatus(), status)}
    assert ("Warning", "DegradedTrue") in kinds


def test_printer_column_summaries() -> None:
    s = compute_status(observe(ready=2), models.LLMDeploymentStatus(), T0)
    assert s.slo_summary == "-/2s"
    assert s.trials_summary == "0/12"
    assert cond(s, "SLOMet").status == "Unknown"


def test_first_unremarkable_states_are_not_announced() -> None:
    first = compute_status(observe(ready=2), models.LLMDeploymentStatus(), T0)
    reasons = {e.reason for e in transitions(models.LLMDeploymentStatus(), first)}
    assert "DegradedFalse" not in reasons
    assert "ReadyTrue" not in reasons
    assert {"ProgressingFalse"} <= reasons


def monitored(
    at: datetime, ttft: float, met: bool = True, ready: int = 2
) -> models.LLMDeploymentStatus:
    """A status as a healthy Prometheus reading at `at` makes it: figures that move."""
    observation = observe(ready)
    slo = models.SloStatus(
        ttft_p95_seconds=ttft, met=met, window="5m", measured_at=at, request_rate=3.0 + ttft
    )
    row = (
        ("SLOMet", "True", "Met", f"ttft p95 {ttft:.3g}s <= 2s over the last 5m")
        if met
        else ("SLOMet", "False", "Violated", "ttft over 2s")
    )
    observation = Observation(**{**observation.__dict__, "monitoring_rows": [row], "slo": slo})
    return compute_status(observation, models.LLMDeploymentStatus(), at)


def test_figures_alone_are_rewritten_at_most_once_a_refresh() -> None:
    first = monitored(T0, 0.51)
    # 30 s later, only the figures moved: the status stays as written.
    later = T0 + timedelta(seconds=30)
    assert settle_figures(first, monitored(later, 0.57), later) == first
    # A minute after the figures were measured, they are written again.
    due = T0 + FIGURES_REFRESH
    assert settle_figures(first, monitored(due, 0.57), due).slo.ttft_p95_seconds == 0.57  # type: ignore[union-attr]


def test_a_verdict_or_anything_else_changing_is_written_at_once() -> None:
    first = monitored(T0, 0.51)
    later = T0 + timedelta(seconds=10)
    violated = monitored(later, 2.4, met=False)
    assert settle_figures(first, violated, later) == violated
    one_down = monitored(later, 0.51, ready=1)
    assert settle_figures(first, one_down, later) == one_down


def test_status_text_is_bounded_and_the_reasons_are_written_once() -> None:
    """A long problem (it may quote what the user wrote) is clipped, saying how much was left
    out; Degraded points to Ready instead of repeating it."""
    problems = ["spec.engine.extraArgs[0]: " + "x" * 10_000, "spec.engine.env[0]: bad"]
    status = compute_status(observe(ready=0, problems=problems), models.LLMDeploymentStatus(), T0)
    ready = cond(status, "Ready")
    assert len(ready.message) <= CONDITION_MESSAGE_LIMIT
    kept = ready.message.split("... (")[0]
    assert ready.message == f"{kept}... ({len('; '.join(problems)) - len(kept)} more characters)"
    assert cond(status, "Degraded").message == "see the Ready condition"
    assert status.message is not None
    assert len(status.message) <= SUMMARY_LIMIT
    assert status.message.startswith("Invalid spec: spec.engine.extraArgs[0]: xxx")
    assert status.message.endswith("(and 1 more in the Ready condition)")
    assert clip("short", 10) == "short"
