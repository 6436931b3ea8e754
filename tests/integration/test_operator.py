"""The operator, under its own ServiceAccount with the chart's ClusterRole, against the real
API server and controller-manager."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from support.cluster import RESYNC_SECONDS, Cluster, OperatorProcess, llmd, wait_for

pytestmark = pytest.mark.integration


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions", []):
        if cond["type"] == type_:
            result: dict[str, Any] = cond
            return result
    return None


def wait_for_reason(
    cluster: Cluster, name: str, namespace: str, type_: str, reason: str, *, timeout: float = 45
) -> dict[str, Any]:
    """The LLMDeployment once its `type_` condition has `reason`."""
    found: dict[str, Any] = wait_for(
        f"a {type_} {reason} condition",
        lambda: (
            (o := cluster.get("llmd", name, namespace))
            and (c := condition(o, type_))
            and c["reason"] == reason
            and o
        ),
        timeout=timeout,
    )
    return found


def engine_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = next(c for c in containers if c["name"] == "vllm")
    return found


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_creates_deployment_and_service_with_the_right_shape(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    assert cluster.apply(llmd("chat", namespace)).returncode == 0
    dep = wait_for("the Deployment", lambda: cluster.get("deployment", "chat", namespace))
    svc = wait_for("the Service", lambda: cluster.get("service", "chat", namespace))

    c = engine_container(dep)
    assert c["image"] == "vllm/vllm-openai:v0.32.0"
    assert flag(c["args"], "--model") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert flag(c["args"], "--max-num-batched-tokens") == "2048"
    assert flag(c["args"], "--block-size") == "16"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["httpGet"]["port"] == "http"
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    owner = dep["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("LLMDeployment", "chat", True)

    # The controller-manager really runs: the Deployment gets its ReplicaSet and Pods.
    wait_for(
        "a ReplicaSet for the Deployment",
        lambda: json.loads(cluster.kubectl("get", "rs", "-n", namespace, "-o", "json").stdout)[
            "items"
        ],
    )

    obj = wait_for(
        "status with conditions",
        lambda: (o := cluster.get("llmd", "chat", namespace)) and condition(o, "Ready") and o,
    )
    ready = condition(obj, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "ReplicasNotReady")
    assert ready["observedGeneration"] == obj["metadata"]["generation"]
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert obj["status"]["phase"] == "Deploying"
    assert (
        obj["status"]["activeConfig"]["hash"]
        == dep["metadata"]["labels"]["slotune.dev/config-hash"]
    )

    table = cluster.kubectl("get", "llmd", "chat", "-n", namespace).stdout
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME", "PHASE", "READY", "TTFT-P95", "SLO-MET", "TRIALS", "CAPACITY", "AGE",
    ]  # fmt: skip
    assert row.split()[:4] == ["chat", "Deploying", "0/1", "-/2s"]
    wide = cluster.kubectl("get", "llmd", "chat", "-n", namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split()[3:5] == ["NEEDED", "PER-REPLICA"]

    events = cluster.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        "involvedObject.name=chat",
        "-o",
        "json",
    ).stdout
    assert "ReadyFalse" in events


def test_deploys_text_outside_the_basic_multilingual_plane(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """An emoji in an env value or a chat template is valid text: the children carry it as
    the user wrote it (JSON's surrogate-pair escapes are not YAML, and an apply patch is
    decoded as YAML, so it must reach the server as UTF-8)."""
    greeting = "Bonjour \U0001f999 \u00e9t\u00e9 \U0001d11e"
    obj = llmd("unicode", namespace)
    obj["spec"]["engine"]["env"] = [{"name": "GREETING", "value": greeting}]
    assert cluster.apply(obj).returncode == 0
    dep = wait_for("the Deployment", lambda: cluster.get("deployment", "unicode", namespace))
    env = {e["name"]: e.get("value") for e in engine_container(dep).get("env", [])}
    assert env["GREETING"] == greeting
    found = wait_for(
        "a status",
        lambda: (o := cluster.get("llmd", "unicode", namespace)) and o.get("status") and o,
    )
    assert condition(found, "Ready") is not None, found["status"]


def test_spec_change_rolls_the_deployment(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    assert cluster.apply(llmd("upd", namespace)).returncode == 0
    before = wait_for("the Deployment", lambda: cluster.get("deployment", "upd", namespace))
    changed = llmd("upd", namespace, replicas=2)
    changed["spec"]["engine"]["args"]["maxNumBatchedTokens"] = 8192
    assert cluster.apply(changed).returncode == 0

    def updated() -> dict[str, Any] | None:
        dep = cluster.get("deployment", "upd", namespace)
        args = engine_container(dep)["args"] if dep else []
        return dep if dep and flag(args, "--max-num-batched-tokens") == "8192" else None

    after = wait_for("the new args", updated)
    assert after["spec"]["replicas"] == 2
    hash_label = "slotune.dev/config-hash"
    assert after["metadata"]["labels"][hash_label] != before["metadata"]["labels"][hash_label]
    obj = wait_for(
        "status for generation 2",
        lambda: (
            (o := cluster.get("llmd", "upd", namespace))
            and o["status"].get("observedGeneration") == 2
            and o
        ),
    )
    assert obj["status"]["ready"] == "0/2"


def test_restores_a_deleted_service_and_a_hand_edited_deployment(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    assert cluster.apply(llmd("drift", namespace)).returncode == 0
    svc = wait_for("the Service", lambda: cluster.get("service", "drift", namespace))
    dep = wait_for("the Deployment", lambda: cluster.get("deployment", "drift", namespace))

    cluster.kubectl("delete", "service", "drift", "-n", namespace)
    restored = wait_for(
        "the Service to come back",
        lambda: (
            (s := cluster.get("service", "drift", namespace))
            and s["metadata"]["uid"] != svc["metadata"]["uid"]
            and s
        ),
    )
    assert restored["spec"]["ports"][0]["name"] == "http"

    args = engine_container(dep)["args"]
    edited = [
        *args[: args.index("--block-size") + 1],
        "64",
        *args[args.index("--block-size") + 2 :],
    ]
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": edited}]}}}}
    cluster.kubectl("patch", "deployment", "drift", "-n", namespace, "-p", json.dumps(patch))
    wait_for(
        "the hand edit to be undone",
        lambda: (
            (d := cluster.get("deployment", "drift", namespace))
            and flag(engine_container(d)["args"], "--block-size") == "16"
        ),
    )


def test_takes_back_what_others_add_to_the_lists_it_renders(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A Service port edited in place (server-side apply would keep it beside slotune's, and
    the server then refuses the duplicate name), and a container and an env var added to the
    Deployment by hand: each is taken back, with an event naming it."""
    assert cluster.apply(llmd("hand", namespace)).returncode == 0
    wait_for("the Service", lambda: cluster.get("service", "hand", namespace))
    dep = wait_for("the Deployment", lambda: cluster.get("deployment", "hand", namespace))

    port = [{"op": "replace", "path": "/spec/ports/0/port", "value": 9000}]
    edit = cluster.kubectl(
        "patch", "service", "hand", "-n", namespace, "--type=json", "-p", json.dumps(port)
    )
    assert edit.returncode == 0, edit.stderr
    containers = dep["spec"]["template"]["spec"]["containers"]
    engine = {
        **containers[0],
        "env": [*containers[0].get("env", []), {"name": "DEBUG", "value": "1"}],
    }
    sidecar = {"name": "sidecar", "image": "busybox", "command": ["sleep", "1d"]}
    patch = {"spec": {"template": {"spec": {"containers": [engine, sidecar]}}}}
    edit = cluster.kubectl(
        "patch", "deployment", "hand", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
    )
    assert edit.returncode == 0, edit.stderr

    wait_for(
        "the Service's port back at 8000, alone",
        lambda: (
            (svc := cluster.get("service", "hand", namespace))
            and [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("http", 8000)]
        ),
    )

    def restored() -> dict[str, Any] | None:
        d = cluster.get("deployment", "hand", namespace)
        spec = d["spec"]["template"]["spec"] if d else {}
        names = [c["name"] for c in spec.get("containers", [])]
        env = {v["name"] for v in engine_container(d).get("env", [])} if d else {"DEBUG"}
        return d if names == ["vllm"] and "DEBUG" not in env else None

    after = wait_for("the sidecar and DEBUG taken back", restored)
    assert engine_container(after)["args"] == engine_container(dep)["args"]
    obj = cluster.get("llmd", "hand", namespace)
    assert obj is not None
    assert obj["status"]["phase"] != "Invalid", obj["status"].get("message")
    events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    notes = [e["message"] for e in json.loads(events)["items"] if e["reason"] == "DriftRepaired"]
    assert any(f"Service {namespace}/hand" in n and "port http:9000/TCP" in n for n in notes)
    assert any("container sidecar" in n and "env var DEBUG of container vllm" in n for n in notes)


def test_keeps_the_children_at_the_last_good_spec_while_the_spec_is_invalid(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """After a bad edit the Deployment keeps serving; scaled or deleted meanwhile, it is put
    back to the last good spec, while the status still says what to fix."""
    good = llmd("keep", namespace)
    assert cluster.apply(good).returncode == 0
    dep = wait_for("the Deployment", lambda: cluster.get("deployment", "keep", namespace))
    bad = llmd("keep", namespace, replicas=2)
    bad["spec"]["engine"]["extraArgs"] = ["--swap-space", "4"]
    assert cluster.apply(bad).returncode == 0
    wait_for(
        "Invalid",
        lambda: (o := cluster.get("llmd", "keep", namespace)) and o["status"]["phase"] == "Invalid",
    )

    cluster.kubectl("scale", "deployment", "keep", "-n", namespace, "--replicas=3")
    wait_for(
        "the scale undone",
        lambda: (d := cluster.get("deployment", "keep", namespace)) and d["spec"]["replicas"] == 1,
    )
    cluster.kubectl("delete", "deployment", "keep", "-n", namespace, "--wait=true")
    back = wait_for(
        "the Deployment recreated at the last good spec",
        lambda: (
            (d := cluster.get("deployment", "keep", namespace))
            and d["metadata"]["uid"] != dep["metadata"]["uid"]
            and d
        ),
    )
    assert engine_container(back)["args"] == engine_container(dep)["args"]
    assert back["spec"]["replicas"] == 1
    obj = cluster.get("llmd", "keep", namespace)
    assert obj is not None
    assert obj["status"]["phase"] == "Invalid"
    assert "--swap-space does not exist in vLLM" in condition(obj, "Ready")["message"]  # type: ignore[index]
    assert obj["status"]["servingSpec"]["engine"] == good["spec"]["engine"]  # the bad edit's not

    # Fixed, the new spec is served and becomes the last good one.
    bad["spec"]["engine"]["extraArgs"] = []
    assert cluster.apply(bad).returncode == 0
    wait_for(
        "two replicas",
        lambda: (d := cluster.get("deployment", "keep", namespace)) and d["spec"]["replicas"] == 2,
    )
    wait_for(
        "servingSpec updated",
        lambda: (
            (o := cluster.get("llmd", "keep", namespace))
            and o["status"].get("servingSpec", {}).get("replicas") == 2
        ),
    )


def test_a_spec_too_large_to_serve_gets_a_condition_and_stays_deletable(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """300 KB of affinity (free-form, so the schema cannot bound it; server-side apply takes
    it, and so would Argo CD): a condition naming the size, Kopf's bookkeeping stays small,
    and the object deletes."""
    big = llmd("huge", namespace)
    terms = [
        {"matchExpressions": [{"key": f"zone-{i}", "operator": "In", "values": ["x" * 900]}]}
        for i in range(330)
    ]
    big["spec"]["scheduling"] = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms
        }}}
    }  # fmt: skip
    applied = cluster.apply(big, "--server-side")
    assert applied.returncode == 0, applied.stderr
    obj = wait_for_reason(cluster, "huge", namespace, "Ready", "InvalidSpec")
    message = condition(obj, "Ready")["message"]  # type: ignore[index]
    assert "KiB, more than slotune serves (64 KiB); its largest part is spec.scheduling" in message
    assert len(obj["status"]["message"]) <= 512
    assert cluster.get("deployment", "huge", namespace) is None
    kopf_notes = {
        k: v for k, v in obj["metadata"].get("annotations", {}).items() if "slotune.dev/" in k
    }
    assert "slotune.dev/last-handled-configuration" not in kopf_notes
    assert sum(len(v) for v in kopf_notes.values()) < 4096, kopf_notes
    deleted = cluster.kubectl("delete", "llmd", "huge", "-n", namespace, "--timeout=60s")
    assert deleted.returncode == 0, deleted.stderr
    assert cluster.get("llmd", "huge", namespace) is None


def test_never_takes_over_an_object_it_does_not_own(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """Another team's Service and Deployment named like an LLMDeployment stay theirs: nothing
    is applied, a condition names each one, and deleting the LLMDeployment leaves them. Once
    the name is free, the LLMDeployment deploys."""
    theirs = {"app.kubernetes.io/name": "their-api"}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "api", "namespace": namespace},
        "spec": {"selector": theirs, "ports": [{"name": "web", "port": 80}]},
    }  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "api", "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": theirs},
            "template": {
                "metadata": {"labels": theirs},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }  # fmt: skip
    for obj in (service, deployment):
        assert cluster.apply(obj).returncode == 0
    before = {
        kind: cluster.get(kind, "api", namespace)["spec"]  # type: ignore[index]
        for kind in ("service", "deployment")
    }

    assert cluster.apply(llmd("api", namespace)).returncode == 0
    status = wait_for_reason(cluster, "api", namespace, "Ready", "ChildConflict")["status"]
    message = condition({"status": status}, "Ready")["message"]  # type: ignore[index]
    assert f"Deployment {namespace}/api already exists" in message
    assert f"Service {namespace}/api already exists" in message
    assert status["phase"] == "Degraded"
    time.sleep(2 * RESYNC_SECONDS)
    for kind in ("service", "deployment"):
        obj = cluster.get(kind, "api", namespace)
        assert obj is not None
        assert obj["spec"] == before[kind], f"the {kind} was changed"
        assert not obj["metadata"].get("ownerReferences"), f"the {kind} got an owner"
    events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    assert "ChildConflict" in events

    # Deleting the LLMDeployment leaves the other team's objects alone.
    cluster.kubectl("delete", "llmd", "api", "-n", namespace, "--wait=true")
    time.sleep(2 * RESYNC_SECONDS)  # the garbage collector would have acted by now
    assert cluster.get("service", "api", namespace) is not None
    assert cluster.get("deployment", "api", namespace) is not None

    # Once the name is free, the LLMDeployment deploys.
    assert cluster.apply(llmd("api", namespace)).returncode == 0
    cluster.kubectl("delete", "service,deployment", "api", "-n", namespace)
    dep = wait_for(
        "slotune's Deployment",
        lambda: (
            (d := cluster.get("deployment", "api", namespace))
            and (d["metadata"].get("ownerReferences") or [{}])[0].get("kind") == "LLMDeployment"
            and d
        ),
    )
    assert engine_container(dep)["image"] == "vllm/vllm-openai:v0.32.0"
    wait_for("slotune's Service", lambda: cluster.get("service", "api", namespace))


def test_nonexistent_vllm_flag_ends_in_a_clear_condition(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    obj = llmd("typo", namespace)
    obj["spec"]["engine"]["extraArgs"] = ["--swap-space", "4"]
    assert cluster.apply(obj).returncode == 0
    status = wait_for_reason(cluster, "typo", namespace, "Ready", "InvalidSpec")["status"]
    assert status["phase"] == "Invalid"
    message = condition({"status": status}, "Ready")["message"]  # type: ignore[index]
    assert "spec.engine.extraArgs[0]: --swap-space does not exist in vLLM" in message
    assert "--kv-offloading-size" in message
    # Nothing was deployed for it, and the operator did not retry in a loop.
    assert cluster.get("deployment", "typo", namespace) is None
    log_before = operator.log().count("Invalid spec")
    version_before = cluster.get("llmd", "typo", namespace)["metadata"]["resourceVersion"]  # type: ignore[index]
    time.sleep(4 * RESYNC_SECONDS)  # several resync periods
    assert operator.log().count("Invalid spec") == log_before
    # Nor did it rewrite an unchanged status.
    assert cluster.get("llmd", "typo", namespace)["metadata"]["resourceVersion"] == version_before  # type: ignore[index]
    assert not operator.dead()

    # Fixing the spec brings it up.
    obj["spec"]["engine"]["extraArgs"] = ["--stream-interval", "2"]
    assert cluster.apply(obj).returncode == 0
    dep = wait_for("the Deployment", lambda: cluster.get("deployment", "typo", namespace))
    assert flag(engine_container(dep)["args"], "--stream-interval") == "2"


def test_deletion_cascades_through_the_garbage_collector(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    assert cluster.apply(llmd("gone", namespace)).returncode == 0
    wait_for("the Deployment", lambda: cluster.get("deployment", "gone", namespace))
    wait_for("the Service", lambda: cluster.get("service", "gone", namespace))
    cluster.kubectl("delete", "llmd", "gone", "-n", namespace, "--wait=true")

    def all_gone() -> bool:
        leftovers = cluster.kubectl(
            "get", "deployment,replicaset,service,pod", "-n", namespace, "-o", "name"
        ).stdout.split()
        return not leftovers

    wait_for("every child to be garbage-collected", all_gone, timeout=60)


def test_resumes_after_being_killed(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    assert cluster.apply(llmd("resume", namespace)).returncode == 0
    first = wait_for(
        "status",
        lambda: (o := cluster.get("llmd", "resume", namespace)) and condition(o, "Ready") and o,
    )
    operator.kill()
    # While the operator is down: a spec change and a deleted child.
    changed = llmd("resume", namespace)
    changed["spec"]["engine"]["args"]["maxNumSeqs"] = 32
    assert cluster.apply(changed).returncode == 0
    cluster.kubectl("delete", "service", "resume", "-n", namespace)

    operator.start()
    wait_for("the Service to be recreated", lambda: cluster.get("service", "resume", namespace))
    wait_for(
        "the new spec to be applied",
        lambda: (
            (d := cluster.get("deployment", "resume", namespace))
            and flag(engine_container(d)["args"], "--max-num-seqs") == "32"
        ),
    )
    after = wait_for(
        "status for generation 2",
        lambda: (
            (o := cluster.get("llmd", "resume", namespace))
            and o["status"].get("observedGeneration") == 2
            and o
        ),
    )
    # Ready stayed False throughout: its transition time did not move.
    assert (
        condition(after, "Ready")["lastTransitionTime"]  # type: ignore[index]
        == condition(first, "Ready")["lastTransitionTime"]  # type: ignore[index]
    )


def test_operator_never_writes_spec(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    obj = llmd("owned", namespace)
    obj["spec"]["engine"]["extraArgs"] = ["--tokenizer-pool-size", "2"]  # invalid: status only
    assert cluster.apply(obj).returncode == 0
    wait_for(
        "status", lambda: (o := cluster.get("llmd", "owned", namespace)) and condition(o, "Ready")
    )
    got = json.loads(
        cluster.kubectl(
            "get", "llmd", "owned", "-n", namespace, "-o", "json", "--show-managed-fields"
        ).stdout
    )
    managers = {entry["manager"] for entry in got["metadata"]["managedFields"]}
    assert "slotune" in managers  # the status, written by server-side apply
    for entry in got["metadata"]["managedFields"]:
        if entry["manager"] in ("kubectl-client-side-apply", "kubectl"):
            continue
        assert "f:spec" not in entry.get("fieldsV1", {}), entry


def test_service_account_cannot_read_secrets(cluster: Cluster, operator: OperatorProcess) -> None:
    result = cluster.kubectl(
        "auth", "can-i", "get", "secrets", "-A", check=False, kubeconfig=operator.kubeconfig
    )
    assert result.stdout.strip() == "no"
    allowed = cluster.kubectl(
        "auth", "can-i", "patch", "deployments", "-A", check=False, kubeconfig=operator.kubeconfig
    )
    assert allowed.stdout.strip() == "yes"


def mark_pods_ready(cluster: Cluster, namespace: str, selector: str) -> int:
    """Plays the kubelet's part for status: there is no container runtime here, so the
    pods' readiness is reported through the API the way a kubelet would report it."""
    pods = json.loads(
        cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    )["items"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for pod in pods:
        status = {
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                ],
            }
        }
        cluster.kubectl(
            "patch", "pod", pod["metadata"]["name"], "-n", namespace,
            "--subresource=status", "--type=merge", "-p", json.dumps(status),
        )  # fmt: skip
    return len(pods)


def test_reports_ready_when_the_pods_are_ready(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    assert cluster.apply(llmd("live", namespace)).returncode == 0
    selector = "app.kubernetes.io/instance=live"
    wait_for(
        "a pod",
        lambda: (
            cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "name").stdout
        ),
    )
    assert mark_pods_ready(cluster, namespace, selector) == 1
    obj = wait_for(
        "Ready=True",
        lambda: (
            (o := cluster.get("llmd", "live", namespace))
            and (c := condition(o, "Ready"))
            and c["status"] == "True"
            and o
        ),
    )
    assert obj["status"]["phase"] == "Ready"
    assert condition(obj, "Progressing")["reason"] == "RolloutComplete"  # type: ignore[index]
    row = cluster.kubectl("get", "llmd", "live", "-n", namespace, "--no-headers").stdout.split()
    assert row[:3] == ["live", "Ready", "1/1"]
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=live",
        "-o", "jsonpath={.items[*].reason}",
    ).stdout.split()  # fmt: skip
    assert "ReadyTrue" in events


def test_a_child_the_server_refuses_becomes_a_condition_and_retries_back_off(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    # A quota of no Services: the API server answers the Service's apply 403, an error that
    # is about the namespace, not about the object slotune rendered.
    cluster.kubectl("create", "quota", "no-services", "--hard=services=0", "-n", namespace)
    assert cluster.apply(llmd("quota", namespace)).returncode == 0
    status = wait_for_reason(cluster, "quota", namespace, "Degraded", "ApplyFailed")["status"]
    message = condition({"status": status}, "Degraded")["message"]  # type: ignore[index]
    assert f"could not apply Service {namespace}/quota: 403 Forbidden" in message
    assert "no-services" in message  # the server's own words name the quota
    assert status["phase"] == "Degraded"
    # The Deployment went in before the Service: what could be applied was.
    assert cluster.get("deployment", "quota", namespace) is not None

    # Retries back off: 10 s, then 20, then 40 ... (each up to 10% later).
    def delays() -> list[int]:
        marker = f"could not apply Service {namespace}/quota"
        return [
            int(line.rsplit("retrying in ", 1)[1].split("s", 1)[0])
            for line in operator.log().splitlines()
            if marker in line and "retrying in " in line
        ]

    seen = wait_for("three retries", lambda: len(delays()) >= 3 and delays(), timeout=90)
    assert seen[:3] == [pytest.approx(d, rel=0.11, abs=1) for d in (10, 20, 40)]

    # Lifting the quota lets the next retry through.
    cluster.kubectl("delete", "quota", "no-services", "-n", namespace)
    wait_for("the Service", lambda: cluster.get("service", "quota", namespace), timeout=120)
    wait_for(
        "Degraded back to False",
        lambda: (
            (o := cluster.get("llmd", "quota", namespace))
            and (c := condition(o, "Degraded"))
            and c["status"] == "False"
        ),
        timeout=60,
    )


def test_serves_in_a_namespace_that_enforces_the_restricted_pod_security_standard(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """PSA restricted refuses the serving pods until the spec sets a securityContext that
    meets it; then the ReplicaSet creates them."""
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    assert cluster.apply(llmd("psa", namespace)).returncode == 0
    status = wait_for_reason(cluster, "psa", namespace, "Degraded", "RolloutFailed", timeout=90)[
        "status"
    ]
    assert "violates PodSecurity" in condition({"status": status}, "Degraded")["message"]  # type: ignore[index]

    restricted = llmd(
        "psa",
        namespace,
        podSecurityContext={
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    )
    restricted["spec"]["engine"]["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert cluster.apply(restricted).returncode == 0

    def serving_pods() -> list[dict[str, Any]]:
        listed = cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", "slotune.dev/llmdeployment=psa", "-o", "json"
        )
        return json.loads(listed.stdout)["items"]  # type: ignore[no-any-return]

    pods = wait_for("a serving pod admitted", serving_pods, timeout=90)
    assert pods[0]["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_log_lines_name_their_object_and_watch_events_are_not_logged(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """What an on-call engineer greps for: each object's lines carry `[namespace/name]`, and
    the watch handlers' routine successes (a line per event of every child) are not logged."""
    bad = llmd("noisy", namespace)
    bad["spec"]["engine"]["extraArgs"] = ["--swap-space", "4"]
    assert cluster.apply(bad).returncode == 0
    wait_for(
        "the error line, naming the object",
        lambda: any(
            f"[{namespace}/noisy]" in line and "failed permanently: Invalid spec" in line
            for line in operator.log().splitlines()
        ),
    )
    assert cluster.apply(llmd("quiet", namespace)).returncode == 0
    wait_for("the Deployment", lambda: cluster.get("deployment", "quiet", namespace))
    for i in range(5):  # child events: each one runs on_child_event
        cluster.kubectl(
            "annotate", "deployment", "quiet", "-n", namespace, f"poke={i}", "--overwrite"
        )
    wait_for(
        "the status line of quiet",
        lambda: f"[{namespace}/quiet] Updated status of {namespace}/quiet" in operator.log(),
    )
    time.sleep(RESYNC_SECONDS)
    log = operator.log()
    assert "Handler 'on_child_event' succeeded." not in log
    assert "Handler 'on_llm_deployment_event' succeeded." not in log
    unnamed = [
        line
        for line in log.splitlines()
        if "[ERROR" in line and namespace in line and f"[{namespace}/" not in line
    ]
    assert unnamed == []


def test_kubectl_scale_sets_the_replicas_under_external_scaling_never_under_capacity(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """The scale subresource: `kubectl scale` (as an HPA or KEDA does) writes spec.replicas,
    which External scaling follows; Capacity scaling keeps its own count (here held at
    minReplicas: no Prometheus answers, so there is no demand to decide from)."""
    external = llmd("outside", namespace, scaling={"mode": "External"})
    assert cluster.apply(external).returncode == 0
    wait_for(
        "the Deployment",
        lambda: (
            (d := cluster.get("deployment", "outside", namespace)) and d["spec"]["replicas"] == 1
        ),
    )
    # An object that never set spec.replicas has the CRD's default, which the scale
    # subresource (what an HPA reads first) reports.
    before = json.loads(
        cluster.kubectl(
            "get", "llmd", "outside", "-n", namespace, "--subresource=scale", "-o", "json"
        ).stdout
    )
    assert before["spec"]["replicas"] == 1
    cluster.kubectl("scale", "llmd", "outside", "-n", namespace, "--replicas", "3")
    wait_for(
        "the Deployment scaled to 3",
        lambda: (
            (d := cluster.get("deployment", "outside", namespace)) and d["spec"]["replicas"] == 3
        ),
    )
    scale = wait_for(
        "the scale subresource to report 3 replicas and the pods' selector",
        lambda: (
            (
                s := json.loads(
                    cluster.kubectl(
                        "get",
                        "llmd",
                        "outside",
                        "-n",
                        namespace,
                        "--subresource=scale",
                        "-o",
                        "json",
                    ).stdout
                )
            )
            and s.get("status", {}).get("replicas") == 3
            and s
        ),
    )
    assert scale["kind"] == "Scale"
    assert scale["status"]["selector"] == (
        "app.kubernetes.io/component=serving,app.kubernetes.io/instance=outside,"
        "app.kubernetes.io/name=vllm"
    )

    sized = llmd("sized", namespace, scaling={"mode": "Capacity", "minReplicas": 2,
                                               "capacityPerReplica": 4.0})  # fmt: skip
    assert cluster.apply(sized).returncode == 0
    held = wait_for_reason(cluster, "sized", namespace, "ScalingLimited", "NoDemand")
    assert held["status"]["scaling"]["desiredReplicas"] == 2
    cluster.kubectl("scale", "llmd", "sized", "-n", namespace, "--replicas", "5")
    time.sleep(2 * RESYNC_SECONDS)
    deployment = cluster.get("deployment", "sized", namespace)
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 2
