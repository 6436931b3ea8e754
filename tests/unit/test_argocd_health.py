"""The Argo CD health check in docs/argocd.md, run as Argo CD runs it: the Lua from the page's
`argocd-cm` example, in Lua 5.1 (Argo CD's gopher-lua speaks 5.1), with the object as `obj`.

Statuses come from `status.compute_status` where the operator produces them today, so the
script is checked against the status the operator really writes, not a guess of its shape.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import lua51

from slotune import models
from slotune.status import DeploymentState, Observation, compute_status, to_patch

DOC = Path(__file__).resolve().parents[2] / "docs" / "argocd.md"
KEY = "resource.customizations.health.slotune.dev_LLMDeployment"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC = {"model": {"name": "m"}, "replicas": 2, "slo": {"ttft": {"maxSeconds": 2}}}


def health_script() -> str:
    for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL):
        config = yaml.safe_load(block)
        if isinstance(config, dict) and KEY in config.get("data", {}):
            script: str = config["data"][KEY]
            return script
    raise AssertionError(f"no {KEY} in {DOC}")


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) as Argo CD would compute them for `obj`."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    # JSON first, as Argo CD hands the object over: plain maps, lists and numbers.
    runtime.globals().obj = runtime.table_from(json.loads(json.dumps(obj)), recursive=True)
    result = runtime.execute(health_script())
    assert result.status in {"Healthy", "Progressing", "Degraded", "Suspended"}, result.status
    return str(result.status), str(result.message)


def llmd(
    status: dict[str, Any] | None, generation: int = 1, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "chat", "namespace": "prod", "generation": generation},
        "spec": spec or SPEC,
    }
    if status is not None:
        obj["status"] = status
    return obj


def operator_status(
    ready: int, problems: list[str] | None = None, failure: str | None = None
) -> dict[str, Any]:
    """The status the operator writes for a Deployment with `ready` of 2 pods ready."""
    observation = Observation(
        generation=1,
        spec=models.LLMDeploymentSpec.model_validate(SPEC),
        problems=problems or [],
        deployment=DeploymentState(
            exists=True, desired=2, ready=ready, updated=ready, failure=failure
        ),
        active_args=["--model", "m"],
        config_hash="abc",
    )
    return to_patch(compute_status(observation, models.LLMDeploymentStatus(), T0))


def with_condition(status: dict[str, Any], type_: str, value: str, message: str) -> dict[str, Any]:
    conditions = [c for c in status["conditions"] if c["type"] != type_]
    conditions.append(
        {
            "type": type_,
            "status": value,
            "reason": "Observed",
            "message": message,
            "lastTransitionTime": T0.isoformat(),
        }
    )
    return {**status, "conditions": conditions}


def test_no_status_yet_is_progressing() -> None:
    assert health(llmd(None)) == (
        "Progressing",
        "Waiting for the slotune operator to observe this LLMDeployment",
    )


def test_a_status_for_an_older_generation_is_progressing() -> None:
    status, message = health(llmd(operator_status(ready=2), generation=3))
    assert status == "Progressing"
    assert "generation 3" in message
    assert "status describes 1" in message


def test_rolling_out_is_progressing_with_the_ready_message() -> None:
    assert health(llmd(operator_status(ready=1))) == (
        "Progressing",
        "Deploying: 1 of 2 replicas ready",
    )


def test_an_invalid_spec_is_degraded_and_says_what_to_fix() -> None:
    problem = "spec.engine.extraArgs: --swap-space was removed from vLLM"
    status, message = health(llmd(operator_status(ready=0, problems=[problem])))
    assert status == "Degraded"
    assert message == f"Invalid spec: {problem}"


def test_a_failed_rollout_is_degraded() -> None:
    failure = "ReplicaSet has timed out progressing"
    status, message = health(llmd(operator_status(ready=1, failure=failure)))
    assert status == "Degraded"
    assert failure in message


def test_scaled_to_zero_is_suspended() -> None:
    scaled = {**SPEC, "replicas": 0}
    assert health(llmd(operator_status(ready=0), spec=scaled)) == (
        "Suspended",
        "Scaled to zero replicas",
    )


def test_ready_with_the_slo_not_measured_yet_is_healthy() -> None:
    written = operator_status(ready=2)
    assert written["conditions"][-1]["type"] == "SLOMet"  # Unknown until measured
    status, message = health(llmd(written))
    assert status == "Healthy"
    assert message == "Ready, 2/2 ready, SLO not measured yet, TTFT -/2s"


def test_a_missed_slo_is_degraded_even_while_tuning() -> None:
    written = with_condition(operator_status(ready=2), "SLOMet", "False", "TTFT p95 2.7s > 2s")
    written["tuning"] = {"state": "Tuning", "trialsCompleted": 3}
    written["trialsSummary"] = "3/20"
    assert health(llmd(written)) == (
        "Degraded",
        "SLO missed: TTFT p95 2.7s > 2s (study Tuning, trials 3/20)",
    )


@pytest.mark.parametrize("state", ["Tuning", "Completed"])
def test_a_met_slo_is_healthy_whatever_the_study_does(state: str) -> None:
    written = with_condition(operator_status(ready=2), "SLOMet", "True", "")
    written["tuning"] = {"state": state}
    written["sloSummary"] = "1.2s/2s"
    status, message = health(llmd(written))
    assert status == "Healthy"
    assert message == f"Ready, 2/2 ready, SLO met, TTFT 1.2s/2s, study {state}"


def test_a_promotion_rolling_out_is_progressing() -> None:
    written = with_condition(
        operator_status(ready=2), "Progressing", "True", "rolling out configuration def"
    )
    assert health(llmd(written)) == ("Progressing", "Ready: rolling out configuration def")
