"""What the operator reads off trial pods and load Jobs, and what a study shows in status."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError
from tests.support.specs import llm_spec, tuning, workload

from slotune import render
from slotune.measure.capacity import Capacity, MeasureRequest
from slotune.measure.record import Measurement
from slotune.models import LLMDeploymentSpec, TuningStatus
from slotune.study import trials
from slotune.tuner.records import TrialRecord, TrialState

OWNER = render.Owner(name="chat", namespace="llm", uid="u-1")


def spec(**fields: Any) -> LLMDeploymentSpec:
    return llm_spec(
        resources={"gpus": 0}, tuning=tuning(workload(prompt=512, duration="20s"), **fields)
    )


def pod(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "chat-trial-1-0"}, "status": status}


def test_a_ready_trial_pod_gives_its_ip() -> None:
    state = trials.PodState.of(
        pod(
            {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "vllm", "state": {"running": {}}}],
            }
        )
    )
    assert (state.phase, state.ip) == ("Ready", "10.1.2.3")


def test_a_crashed_trial_pod_is_classified_from_its_termination_message() -> None:
    log = (
        "INFO starting\n"
        "ValueError: To serve at least one request with the models's max seq len (4096), "
        "(0.50 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.10 GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"
    )
    terminated = {"exitCode": 1, "reason": "Error", "message": log}
    state = trials.PodState.of(
        pod({"phase": "Failed", "containerStatuses": [{"state": {"terminated": terminated}}]})
    )
    assert state.phase == "Failed"
    assert state.failure_kind == "KVCacheTooSmall"
    assert "KV cache" in state.detail


def test_an_oom_killed_trial_pod_is_out_of_memory() -> None:
    terminated = {"exitCode": 137, "reason": "OOMKilled", "message": ""}
    state = trials.PodState.of(
        pod({"phase": "Failed", "containerStatuses": [{"state": {"terminated": terminated}}]})
    )
    assert state.failure_kind == "OutOfMemory"


def test_an_unschedulable_trial_pod_is_blocked_not_failed() -> None:
    state = trials.PodState.of(
        pod(
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    }
                ],
            }
        )
    )
    assert state.phase == "Blocked"
    assert "Insufficient nvidia.com/gpu" in state.detail


def test_an_image_pull_error_blocks_the_trial() -> None:
    waiting = {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}
    state = trials.PodState.of(
        pod({"phase": "Pending", "containerStatuses": [{"state": {"waiting": waiting}}]})
    )
    assert state.phase == "Blocked"


def test_a_pod_being_deleted_is_gone() -> None:
    assert trials.PodState.of(None).phase == "Gone"
    deleting = {"metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert trials.PodState.of(deleting).phase == "Gone"


JOB_UID = "job-uid"
LOAD = {"name": "load", "image": "slotune:1", "command": ["slotune"], "args": ["trial-load"]}


def job(conditions: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "chat-load-1-0",
            "uid": JOB_UID,
            "ownerReferences": [OWNER.reference()],
            **meta,
        },
        "spec": {"template": {"spec": {"containers": [LOAD]}}},
        "status": {"conditions": conditions or []},
    }


def load_pod(
    exit_code: int,
    message: str,
    *,
    job_uid: str = JOB_UID,
    container: dict[str, Any] = LOAD,
    **meta: Any,
) -> dict[str, Any]:
    """A load pod as the Job controller makes it: controlled by the Job, labelled with its UID."""
    terminated = {"exitCode": exit_code, "message": message}
    reference = {"kind": "Job", "name": "chat-load-1-0", "uid": job_uid, "controller": True}
    return {
        "metadata": {
            "name": "chat-load-1-0-x",
            "labels": {"job-name": "chat-load-1-0", trials.JOB_CONTROLLER_UID: job_uid},
            "ownerReferences": [reference],
            **meta,
        },
        "spec": {"containers": [container]},
        "status": {"containerStatuses": [{"name": "load", "state": {"terminated": terminated}}]},
    }


def test_a_finished_load_job_hands_back_its_measurement() -> None:
    found = Capacity(capacity=2.2, upper=2.5, target_rate=2.2, feasible=True, stopped="bracketed")
    measured = Measurement(capacity=found, slo_percentiles={"ttft": 0.4, "tpot": 0.03})
    state = trials.LoadState.of(
        job(), [load_pod(0, measured.model_dump_json())], owner_uid=OWNER.uid
    )
    assert state.phase == "Done"
    assert state.measurement == measured


def test_a_failed_load_job_says_why() -> None:
    state = trials.LoadState.of(
        job(), [load_pod(1, "Traceback ...\nConnectionRefusedError")], owner_uid=OWNER.uid
    )
    assert state.phase == "Failed"
    assert "ConnectionRefusedError" in state.detail
    deadline = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": ""}]
    assert trials.LoadState.of(job(deadline), [], owner_uid=OWNER.uid).phase == "Failed"
    assert trials.LoadState.of(job(), [], owner_uid=OWNER.uid).phase == "Running"
    assert trials.LoadState.of(None, [], owner_uid=OWNER.uid).phase == "Gone"


def test_the_study_restarts_only_for_changes_that_change_what_it_measures() -> None:
    base = spec()
    assert trials.spec_hash(base) == trials.spec_hash(spec(apply="Recommend"))
    assert trials.spec_hash(base) == trials.spec_hash(spec(retune={"after": "1m"}))
    assert trials.spec_hash(base) != trials.spec_hash(spec(maxTrials=3))
    other_slo = base.model_copy(update={"slo": spec().slo.model_copy(update={"window": "1m"})})  # type: ignore[union-attr]
    assert trials.spec_hash(base) != trials.spec_hash(other_slo)


def record(number: int, state: TrialState, feasible: bool, score: float) -> TrialRecord:
    return TrialRecord(
        number=number,
        params={"max_num_batched_tokens": 256 * (number + 1), "max_num_seqs": 8},
        state=state,
        feasible=feasible,
        score=score,
        measurement=Measurement(
            capacity=Capacity(
                capacity=score, upper=None, target_rate=1.0, feasible=feasible, stopped="-"
            )
        )
        if state == TrialState.MEASURED
        else None,
    )


def test_status_counts_trials_and_shows_the_best() -> None:
    records = [
        record(0, TrialState.MEASURED, False, 0.5),
        record(1, TrialState.FAILED, False, 0.0),
        record(2, TrialState.REJECTED, False, 0.0),
        record(3, TrialState.MEASURED, True, 1.8),
    ]
    summary = trials.summarize(records, TuningStatus())
    assert (summary.trials_completed, summary.trials_failed) == (3, 1)
    assert summary.best is not None
    assert summary.best.number == 3
    assert [t.number for t in summary.trials] == [0, 1, 2, 3]


def test_a_recommendation_carries_a_patch_of_the_spec() -> None:
    winner = record(3, TrialState.MEASURED, True, 1.8)
    now = datetime(2026, 11, 30, tzinfo=UTC)
    recommended = trials.recommendation(spec(), winner, now)
    patch = json.loads(recommended["patch"])
    assert patch == {"spec": {"engine": {"args": {"maxNumBatchedTokens": 1024, "maxNumSeqs": 8}}}}
    assert recommended["trial"] == 3


def test_trial_pods_stay_outside_the_serving_service() -> None:
    s = spec()
    trial_pod = render.render_trial_pod(OWNER, s, {"max_num_batched_tokens": 256}, 1, 4)
    selector = render.render_service(OWNER, s)["spec"]["selector"]
    labels = trial_pod["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in selector.items())
    assert trial_pod["spec"]["restartPolicy"] == "Never"
    assert "--max-num-batched-tokens" in trial_pod["spec"]["containers"][0]["args"]
    assert trial_pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_the_load_job_runs_the_operator_image_and_reports_through_its_termination_message() -> None:
    s = spec()
    job_obj = render.render_load_job(
        OWNER,
        s,
        image="slotune/operator:1",
        url="http://10.0.0.9:8000",
        workload=s.tuning.workload,
        request=MeasureRequest(seed=1, target_rate=2.2, measure_ceiling=True),
        study=1,
        trial=4,
    )
    container = job_obj["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "slotune/operator:1"
    assert container["command"] == ["slotune"]
    assert (
        container["args"][container["args"].index("--result-file") + 1]
        == (container["terminationMessagePath"])
    )
    assert container["args"][container["args"].index("--target-rate") + 1] == "2.2"
    assert "--measure-ceiling" in container["args"]
    assert job_obj["spec"]["backoffLimit"] == 0
    assert job_obj["metadata"]["name"] == "chat-load-1-4"
    # PSA restricted, whatever the namespace enforces.
    assert job_obj["spec"]["template"]["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_a_load_result_counts_only_from_a_pod_the_job_controls() -> None:
    """A pod anyone made under the Job's name and labels reports nothing: the result is read
    only from a pod controlled by the Job's UID, labelled with it, running its template."""
    found = Capacity(capacity=9.0, upper=None, target_rate=2.2, feasible=True, stopped="all passed")
    forged = Measurement(capacity=found).model_dump_json()
    copied_labels = load_pod(0, forged, ownerReferences=[])  # the labels, no controller
    other_job = load_pod(0, forged, job_uid="another-job")  # controlled by another Job
    # The Job controller adopts an orphan with its labels: the pod must also run its template.
    adopted = load_pod(0, forged, container={**LOAD, "image": "busybox", "args": ["echo"]})
    for pod in (copied_labels, other_job, adopted):
        assert trials.LoadState.of(job(), [pod], owner_uid=OWNER.uid).phase == "Running"


def test_a_job_or_pod_slotune_does_not_control_is_a_conflict_never_the_trials() -> None:
    """A Job at the load Job's name, or a pod at the trial pod's name, that this LLMDeployment
    does not control is a conflict: not read, and (by the study) not deleted."""
    squatting_job = job(ownerReferences=[])
    state = trials.LoadState.of(squatting_job, [load_pod(0, "{}")], owner_uid=OWNER.uid)
    assert state.phase == "Conflict"
    assert "already exists" in state.detail
    ready = pod({"podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}]})
    assert trials.PodState.of(ready, owner_uid=OWNER.uid).phase == "Conflict"
    ready["metadata"]["ownerReferences"] = [OWNER.reference()]
    assert trials.PodState.of(ready, owner_uid=OWNER.uid).phase == "Ready"
    # Named as the owner but another object (another UID): still not ours.
    ready["metadata"]["ownerReferences"] = [{**OWNER.reference(), "uid": "u-2"}]
    assert trials.PodState.of(ready, owner_uid=OWNER.uid).phase == "Conflict"


def test_a_measurement_refuses_figures_no_measurement_makes() -> None:
    """NaN, infinity and negative figures are refused where a measurement is made and where it
    is read (JSON keeps NaN as null, which would not load back)."""
    with pytest.raises(ValidationError):
        Measurement(request_throughput=float("nan"))
    with pytest.raises(ValidationError):
        Measurement(ttft_p95=-1.0)
    with pytest.raises(ValidationError):
        Capacity(capacity=-2.0, target_rate=2.0, feasible=False, stopped="x")
    with pytest.raises(ValidationError):
        Capacity(capacity=2, estimate=float("inf"), target_rate=2, feasible=True, stopped="x")
    text = json.dumps(
        {
            "capacity": {
                "capacity": 2,
                "target_rate": 2,
                "feasible": True,
                "stopped": "x",
                "estimate": -3,
            }
        }
    )
    state = trials.LoadState.of(job(), [load_pod(0, text)], owner_uid=OWNER.uid)
    assert state.phase == "Failed"
    assert "unreadable load result" in state.detail


def test_a_sidecar_a_pinned_digest_and_a_token_mount_are_the_clusters_not_a_forgery() -> None:
    """What admission adds to the pods a Job makes (an injected sidecar, the image pinned to its
    digest, the service-account token's mount) does not make the Job's own pod foreign; another
    environment does."""
    done = Measurement(capacity=Capacity(capacity=2, target_rate=2, feasible=True, stopped="x"))
    mounted = {**LOAD, "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}
    template = job()
    template["spec"]["template"]["spec"].update(
        containers=[mounted], volumes=[{"name": "tmp", "emptyDir": {}}]
    )
    admitted = {
        **mounted,
        "image": "slotune:1@sha256:" + "0" * 64,
        "volumeMounts": [
            *mounted["volumeMounts"],
            {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io"},
        ],
    }
    pod = load_pod(0, done.model_dump_json(), container=admitted)
    pod["spec"]["containers"].append({"name": "istio-proxy", "image": "proxy"})
    pod["spec"]["volumes"] = [{"name": "tmp", "emptyDir": {}}, {"name": "kube-api-access-x"}]
    assert trials.LoadState.of(template, [pod], owner_uid=OWNER.uid).phase == "Done"
    pod["spec"]["containers"][0]["env"] = [{"name": "PYTHONPATH", "value": "/evil"}]
    assert trials.LoadState.of(template, [pod], owner_uid=OWNER.uid).phase == "Running"
