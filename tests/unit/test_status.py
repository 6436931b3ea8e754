"""Status and conditions from observations, with an injected clock."""

from datetime import UTC, datetime, timedelta

from slotune import models
from slotune.status import DeploymentState, Observation, compute_status, transitions

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
