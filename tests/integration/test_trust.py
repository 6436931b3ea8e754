"""Trust, against the real API server (RBAC on, the operator under the chart's ServiceAccount):
a careless or hostile edit of a spec, of the study's records or of the objects beside a trial
never takes the last good configuration with it, never stops reconciliation, and never
becomes the study's verdict."""

from __future__ import annotations

import json
import time
from typing import Any

from slotune.measure.capacity import Capacity
from slotune.measure.record import Measurement
from support.cluster import Cluster, OperatorProcess, llmd, wait_for

JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    found = next(
        (
            c
            for c in ((obj or {}).get("status") or {}).get("conditions") or []
            if c["type"] == type_
        ),
        None,
    )
    return found or {}


def engine_args(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_a_typo_in_a_free_form_field_is_a_spec_error_and_the_last_good_keeps_serving(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A misspelt security-context field, an env name given twice, or HF_TOKEN beside the
    token Secret: each is `Invalid` naming the field (never a retried `ApplyFailed`), the last
    good spec stays the one served, and a Deployment deleted meanwhile comes back at once."""
    token = {"huggingFace": {"tokenSecretRef": {"name": "hf", "key": "token"}}}
    model = {"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": "typo", "source": token}
    good = llmd("typo", namespace, model=model)
    assert cluster.apply(good).returncode == 0
    served = wait_for("the Deployment", lambda: cluster.get("deployment", "typo", namespace))
    wait_for(
        "the good spec recorded as served",
        lambda: ((cluster.get("llmd", "typo", namespace) or {}).get("status") or {}).get(
            "servingSpec"
        ),
    )

    typos: list[tuple[dict[str, Any], str]] = [
        (
            {"securityContext": {"allowPrivilegeEscalaton": False}},
            "spec.engine.securityContext.allowPrivilegeEscalaton: not a field of SecurityContext; "
            "did you mean allowPrivilegeEscalation?",
        ),
        (
            {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
            "spec.engine.env[1].name: A is given twice",
        ),
        ({"env": [{"name": "HF_TOKEN", "value": "x"}]}, "spec.engine.env[0].name: HF_TOKEN"),
    ]
    for edit, message in typos:
        bad = llmd("typo", namespace, model=model)
        bad["spec"]["engine"].update(edit)
        assert cluster.apply(bad).returncode == 0, edit
        obj = wait_for(
            f"Invalid for {edit}",
            lambda m=message: (
                (o := cluster.get("llmd", "typo", namespace))
                and m in condition(o, "Ready").get("message", "")
                and o
            ),
        )
        assert obj["status"]["phase"] == "Invalid"
        assert condition(obj, "Degraded").get("reason") != "ApplyFailed"
        assert obj["status"]["servingSpec"]["engine"] == good["spec"]["engine"]

    # The last typo stays; a Deployment deleted meanwhile is recreated at the last good spec.
    cluster.kubectl("delete", "deployment", "typo", "-n", namespace, "--wait=true")
    deleted = time.monotonic()
    back = wait_for(
        "the Deployment recreated",
        lambda: (
            (d := cluster.get("deployment", "typo", namespace))
            and d["metadata"]["uid"] != served["metadata"]["uid"]
            and d
        ),
        timeout=30,
    )
    print(f"\nrecreated {time.monotonic() - deleted:.2f} s after the delete")
    assert engine_args(back) == engine_args(served)
    names = [v["name"] for v in back["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names.count("HF_TOKEN") == 1
    # Never retried as a failed apply (the log is the whole session's: this object's lines).
    mine = [line for line in operator.log().splitlines() if f"[{namespace}/typo]" in line]
    assert mine
    assert not [line for line in mine if "ApplyFailed" in line or "could not apply" in line]


def tuned(name: str, namespace: str) -> dict[str, Any]:
    """An LLMDeployment with a study: its trial pod stays Pending here (no kubelet) unless a
    test plays the kubelet's part."""
    workload = {
        "source": "Synthetic",
        "requestRate": 1.0,
        "promptTokens": {"mean": 256},
        "outputTokens": {"mean": 16},
        "duration": "10s",
    }
    return llmd(name, namespace, tuning={"enabled": True, "maxTrials": 2, "workload": workload})


def test_a_record_that_does_not_load_is_quarantined_and_serving_goes_on(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """One bad line in `<name>-trials` (or a NaN stored as null) is moved aside, as it was, with
    an Event; the study, the status and drift repair go on."""
    assert cluster.apply(tuned("rec", namespace)).returncode == 0
    wait_for("the Deployment", lambda: cluster.get("deployment", "rec", namespace))
    records = wait_for(
        "the records ConfigMap", lambda: cluster.get("configmap", "rec-trials", namespace)
    )
    bad = ['{"number": 0, "params": {}, "state": "Measured", "score": null}', "not json"]
    text = records["data"].get("trials.jsonl", "") + "\n".join(bad) + "\n"
    patch = {"data": {"trials.jsonl": text}}
    cluster.kubectl(
        "patch", "configmap", "rec-trials", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
    )
    moved = wait_for(
        "the bad lines quarantined",
        lambda: (
            (c := cluster.get("configmap", "rec-trials", namespace))
            and "unreadable.jsonl" in (c.get("data") or {})
            and c
        ),
    )
    assert moved["data"]["unreadable.jsonl"].splitlines() == bad
    assert "not json" not in moved["data"]["trials.jsonl"]
    events = json.loads(
        cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", "reason=RecordsQuarantined",
            "-o", "json",
        ).stdout
    )["items"]  # fmt: skip
    assert events
    assert "2 trial record(s) of study 1" in events[0]["message"]

    # Reconciliation goes on: a hand scale is repaired, and the status follows a spec edit.
    cluster.kubectl("scale", "deployment", "rec", "-n", namespace, "--replicas=3")
    wait_for(
        "the scale undone",
        lambda: (d := cluster.get("deployment", "rec", namespace)) and d["spec"]["replicas"] == 1,
    )
    edited = tuned("rec", namespace)
    edited["spec"]["replicas"] = 2
    assert cluster.apply(edited).returncode == 0
    wait_for(
        "the edit served",
        lambda: (d := cluster.get("deployment", "rec", namespace)) and d["spec"]["replicas"] == 2,
    )
    assert "ValidationError" not in operator.log()


def tuning_conflict(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    """The LLMDeployment once its Tuning condition says `ChildConflict`."""
    found: dict[str, Any] = wait_for(
        "ChildConflict",
        lambda: (
            (o := cluster.get("llmd", name, namespace))
            and condition(o, "Tuning").get("reason") == "ChildConflict"
            and o
        ),
        timeout=60,
    )
    return found


def _pod(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def _set_status(cluster: Cluster, name: str, namespace: str, status: dict[str, Any]) -> None:
    cluster.kubectl(
        "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def _terminated(message: str) -> dict[str, Any]:
    """A pod status as a kubelet reports a container that exited 0 with `message`."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    state = {"terminated": {"exitCode": 0, "message": message, "startedAt": now, "finishedAt": now}}
    return {
        "phase": "Succeeded",
        "containerStatuses": [
            {"name": "load", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
             "state": state},
        ],
    }  # fmt: skip


def _measured(rate: float) -> str:
    capacity = Capacity(capacity=rate, upper=None, target_rate=1.1, feasible=True, stopped="x")
    return Measurement(capacity=capacity, slo_percentiles={"ttft": 0.2}).model_dump_json()


def test_a_squatting_trial_pod_and_a_forged_load_pod_are_never_the_trials(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A pod made beforehand under the trial pod's name is a `ChildConflict`: not used, not
    deleted. A pod labelled like the load Job's, with a result, is not read: the trial records
    what the Job's own pod reports."""
    squatter = _pod("trust-trial-1-0", namespace, {"app.kubernetes.io/component": "trial"})
    assert cluster.apply(squatter).returncode == 0
    squatter_uid = cluster.get("pod", "trust-trial-1-0", namespace)["metadata"]["uid"]  # type: ignore[index]
    assert cluster.apply(tuned("trust", namespace)).returncode == 0
    obj = tuning_conflict(cluster, "trust", namespace)
    assert (
        "Pod " + namespace + "/trust-trial-1-0 already exists"
        in condition(obj, "Tuning")["message"]
    )
    assert cluster.get("deployment", "trust", namespace) is not None  # serving goes on
    time.sleep(5)  # several resyncs
    still = cluster.get("pod", "trust-trial-1-0", namespace)
    assert still is not None
    assert still["metadata"]["uid"] == squatter_uid

    # Once it is gone, slotune makes its own trial pod; played ready, its load Job starts.
    cluster.kubectl("delete", "pod", "trust-trial-1-0", "-n", namespace, "--wait=true")
    trial = wait_for(
        "slotune's trial pod",
        lambda: (
            (p := cluster.get("pod", "trust-trial-1-0", namespace))
            and p["metadata"].get("ownerReferences")
            and p
        ),
        timeout=60,
    )
    assert trial["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    # Only the trial's load Job may reach its engine (dev-mode endpoints included).
    policy = cluster.get("networkpolicy", "trust-trial-1-0", namespace)
    assert policy is not None
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "trial"
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "load"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _set_status(cluster, "trust-trial-1-0", namespace, {
        "phase": "Running", "podIP": "10.9.8.7", "podIPs": [{"ip": "10.9.8.7"}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
    })  # fmt: skip
    job = wait_for("the load Job", lambda: cluster.get("job", "trust-load-1-0", namespace), 60)
    uid = job["metadata"]["uid"]
    wait_for("the Job controller's pod", lambda: _job_pods(cluster, namespace, uid), timeout=60)

    # Forged: the Job's labels copied (its name and its UID). The Job controller adopts such
    # an orphan and counts its success, but slotune reads no result from a pod the Job did not
    # make from its template: the trial is measured again, by a new Job.
    labels = {"job-name": "trust-load-1-0", JOB_CONTROLLER_UID: uid}
    assert cluster.apply(_pod("forged", namespace, labels)).returncode == 0
    _set_status(cluster, "forged", namespace, _terminated(_measured(99.0)))
    time.sleep(6)  # two resyncs
    tuning = cluster.get("llmd", "trust", namespace)["status"]["tuning"]  # type: ignore[index]
    assert not tuning.get("trials"), tuning

    # The Job's own pod (of the Job now there) reports: that is what the trial records.
    def own_pod() -> str | None:
        now = cluster.get("job", "trust-load-1-0", namespace)
        made = _job_pods(cluster, namespace, now["metadata"]["uid"]) if now else []
        return next(
            (p["metadata"]["name"] for p in made if p["metadata"]["name"] != "forged"), None
        )

    name = wait_for("a load pod the Job made", own_pod, timeout=60)
    _set_status(cluster, name, namespace, _terminated(_measured(3.0)))
    recorded = wait_for(
        "the trial recorded",
        lambda: (
            (o := cluster.get("llmd", "trust", namespace))
            and (o["status"].get("tuning") or {}).get("trials")
        ),
        timeout=60,
    )
    assert recorded[0]["capacity"] == 3.0


def test_a_network_policy_at_the_trials_name_is_not_taken_over(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A NetworkPolicy someone made under the trial's name is a `ChildConflict`: applied, it
    would take over the fields of a policy that guards other pods. It is left as it was; once
    it is gone, slotune makes its own policy and then the trial pod."""
    theirs = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "guard-trial-1-0", "namespace": namespace},
        "spec": {"podSelector": {"matchLabels": {"team": "theirs"}}, "policyTypes": ["Ingress"]},
    }
    assert cluster.apply(theirs).returncode == 0
    made = cluster.get("networkpolicy", "guard-trial-1-0", namespace)
    assert made is not None
    assert cluster.apply(tuned("guard", namespace)).returncode == 0
    obj = tuning_conflict(cluster, "guard", namespace)
    assert (
        "NetworkPolicy " + namespace + "/guard-trial-1-0 already exists"
        in condition(obj, "Tuning")["message"]
    )
    time.sleep(5)  # several resyncs
    still = cluster.get("networkpolicy", "guard-trial-1-0", namespace)
    assert still is not None
    assert still["metadata"]["uid"] == made["metadata"]["uid"]
    assert still["spec"] == made["spec"]
    assert not still["metadata"].get("ownerReferences")
    assert cluster.get("pod", "guard-trial-1-0", namespace) is None  # no trial without its policy

    cluster.kubectl("delete", "networkpolicy", "guard-trial-1-0", "-n", namespace, "--wait=true")
    ours = wait_for(
        "slotune's policy",
        lambda: (
            (n := cluster.get("networkpolicy", "guard-trial-1-0", namespace))
            and n["metadata"].get("ownerReferences")
            and n
        ),
        timeout=60,
    )
    assert ours["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    wait_for("the trial pod", lambda: cluster.get("pod", "guard-trial-1-0", namespace), 60)


def _job_pods(cluster: Cluster, namespace: str, uid: str) -> list[dict[str, Any]]:
    selector = f"{JOB_CONTROLLER_UID}={uid}"
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    pods: list[dict[str, Any]] = json.loads(out)["items"]
    return pods


def test_without_the_policy_privilege_needs_the_namespaces_own_pod_security_level(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A privileged engine with added capabilities, run as root: `Invalid` with nothing applied
    in a namespace that does not enforce the privileged level by its label, served once the
    namespace's owner labels it so."""
    spec = llmd("priv", namespace, podSecurityContext={"runAsUser": 0})
    spec["spec"]["engine"]["securityContext"] = {
        "privileged": True,
        "capabilities": {"add": ["SYS_ADMIN"]},
    }
    assert cluster.apply(spec).returncode == 0
    obj = wait_for(
        "Invalid",
        lambda: (
            (o := cluster.get("llmd", "priv", namespace))
            and (o.get("status") or {}).get("phase") == "Invalid"
            and o
        ),
    )
    message = condition(obj, "Ready")["message"]
    for what in ("privileged: true", "capabilities.add: SYS_ADMIN", "runAsUser: 0 (root)"):
        assert f"{what}: namespace {namespace} does not allow it" in message, message
    assert cluster.get("deployment", "priv", namespace) is None

    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=privileged"
    )
    served = wait_for(
        "served once the namespace allows it",
        lambda: cluster.get("deployment", "priv", namespace),
        timeout=60,
    )
    context = served["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert context["privileged"] is True


def test_an_env_from_added_by_hand_is_taken_back(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A Secret poured into the engine's environment by hand (`envFrom`) goes, with an event
    naming it, as an added env var does."""
    assert cluster.apply(llmd("from", namespace)).returncode == 0
    dep = wait_for("the Deployment", lambda: cluster.get("deployment", "from", namespace))
    engine = {**dep["spec"]["template"]["spec"]["containers"][0]}
    engine["envFrom"] = [{"secretRef": {"name": "cloud-keys"}}]
    patch = {"spec": {"template": {"spec": {"containers": [engine]}}}}
    edit = cluster.kubectl(
        "patch", "deployment", "from", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
    )
    assert edit.returncode == 0, edit.stderr
    wait_for(
        "envFrom taken back",
        lambda: (
            (d := cluster.get("deployment", "from", namespace))
            and "envFrom" not in d["spec"]["template"]["spec"]["containers"][0]
        ),
    )
    events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    notes = [e["message"] for e in json.loads(events)["items"] if e["reason"] == "DriftRepaired"]
    assert any("envFrom secret cloud-keys of container vllm" in n for n in notes), notes
