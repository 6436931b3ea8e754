"""The health check's test cases, in the layout Argo CD's `resource_customizations/` uses:
`testdata/<case>.yaml` (an LLMDeployment as the API server returns it) and `health_test.yaml`
(the health Argo CD must compute for each).

The objects' statuses are written by the operator's own code (`slotune.status.compute_status`,
`to_patch`), so the check is tested against the status slotune really writes, not a guess of
its shape; the expected health is stated here, case by case. `health_test.go` runs the check
over them in gopher-lua, the Lua engine Argo CD embeds.

    .venv/bin/python tools/argocd/cases.py           # write the files
    .venv/bin/python tools/argocd/cases.py --check   # fail if they differ (scripts/generated.sh)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from slotune import models
from slotune.status import DeploymentState, Observation, compute_status, to_patch

HERE = Path(__file__).resolve().parent / "resource_customizations" / "slotune.dev" / "LLMDeployment"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC: dict[str, Any] = {"model": {"name": "m"}, "replicas": 2, "slo": {"ttft": {"maxSeconds": 2}}}
PROBLEM = "spec.engine.extraArgs: --swap-space was removed from vLLM"
FAILURE = "ReplicaSet has timed out progressing"


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
    """`status` with one condition set as the operator sets it."""
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


def studying(state: str, *, slo: str, trials: str = "3/20") -> dict[str, Any]:
    """Ready on both replicas, the SLO condition at `slo`, a study in `state`."""
    message = "TTFT p95 2.7s > 2s" if slo == "False" else ""
    status = with_condition(operator_status(ready=2), "SLOMet", slo, message)
    status["tuning"] = {"state": state, "trialsCompleted": 3}
    status["trialsSummary"] = trials
    if slo == "True":
        status["sloSummary"] = "1.2s/2s"
    return status


def llmd(
    status: dict[str, Any] | None,
    *,
    generation: int = 1,
    spec: dict[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "chat", "namespace": "prod", "generation": generation}
    if deleting:
        metadata["deletionTimestamp"] = T0.isoformat()
        metadata["finalizers"] = ["foregroundDeletion"]
    obj: dict[str, Any] = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": metadata,
        "spec": spec or SPEC,
    }
    if status is not None:
        obj["status"] = status
    return obj


@dataclass(frozen=True)
class Case:
    name: str
    obj: dict[str, Any]
    status: str
    message: str


def cases() -> list[Case]:
    return [
        Case(
            "progressing_nostatus",
            llmd(None),
            "Progressing",
            "Waiting for the slotune operator to observe this LLMDeployment",
        ),
        Case(
            "stale",
            llmd(operator_status(ready=2), generation=3),
            "Progressing",
            "Waiting for the slotune operator to observe generation 3 (status describes 1)",
        ),
        Case(
            "terminating",
            llmd(operator_status(ready=2), deleting=True),
            "Progressing",
            "Being deleted: waiting for its pods and other children to go",
        ),
        Case(
            "invalid",
            llmd(operator_status(ready=0, problems=[PROBLEM])),
            "Degraded",
            f"Invalid spec: {PROBLEM}",
        ),
        Case(
            "degraded",
            llmd(operator_status(ready=1, failure=FAILURE)),
            "Degraded",
            f"Degraded: {FAILURE}",
        ),
        Case(
            "suspended",
            llmd(operator_status(ready=0), spec={**SPEC, "replicas": 0}),
            "Suspended",
            "Scaled to zero replicas",
        ),
        Case(
            "progressing",
            llmd(operator_status(ready=1)),
            "Progressing",
            "Deploying: 1 of 2 replicas ready",
        ),
        Case(
            "progressing_rollout",
            llmd(
                with_condition(
                    operator_status(ready=2), "Progressing", "True", "rolling out configuration def"
                )
            ),
            "Progressing",
            "Ready: rolling out configuration def",
        ),
        Case(
            "degraded_slo_missed_while_tuning",
            llmd(studying("Tuning", slo="False")),
            "Degraded",
            "SLO missed: TTFT p95 2.7s > 2s (study Tuning, trials 3/20)",
        ),
        Case(
            "progressing_tuning",
            llmd(studying("Tuning", slo="True")),
            "Progressing",
            "Ready, 2/2 ready, SLO met, TTFT 1.2s/2s, study Tuning, trials 3/20",
        ),
        Case(
            "progressing_promoting",
            llmd(studying("Promoting", slo="True", trials="20/20")),
            "Progressing",
            "Ready, 2/2 ready, SLO met, TTFT 1.2s/2s, study Promoting, trials 20/20",
        ),
        Case(
            "healthy_tuned",
            llmd(studying("Completed", slo="True", trials="20/20")),
            "Healthy",
            "Ready, 2/2 ready, SLO met, TTFT 1.2s/2s, study Completed, trials 20/20",
        ),
        Case(
            "healthy_slo_not_measured",
            llmd(operator_status(ready=2)),
            "Healthy",
            "Ready, 2/2 ready, SLO not measured yet, TTFT -/2s",
        ),
    ]


def files() -> dict[Path, str]:
    """Every file this writes, by path, with its content."""
    out: dict[Path, str] = {}
    tests = []
    for case in cases():
        path = f"testdata/{case.name}.yaml"
        out[HERE / path] = yaml.safe_dump(case.obj, sort_keys=False)
        tests.append(
            {"healthStatus": {"status": case.status, "message": case.message}, "inputPath": path}
        )
    out[HERE / "health_test.yaml"] = yaml.safe_dump({"tests": tests}, sort_keys=False)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if any file differs")
    args = parser.parse_args()
    wanted = files()
    stale = sorted(
        {p for p, text in wanted.items() if not p.is_file() or p.read_text() != text}
        | set((HERE / "testdata").glob("*.yaml")) - set(wanted)
    )
    if args.check:
        for path in stale:
            print(f"{path}: not what tools/argocd/cases.py writes; run it", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        if path in wanted:
            path.write_text(wanted[path])
        else:
            path.unlink()
    print(f"Wrote {len(stale)} of {len(wanted)} files under {HERE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
