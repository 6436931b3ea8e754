"""The test kubelet (support.kubelet) on the real control plane: pods of Deployments, Jobs and
bare pods run as local processes and report their status through the API, as on a node.

The fast tests run small shell and Python commands. The `engine` tests run the real vLLM CPU
engine in a Deployment's pod (through the ReplicaSet controller), scrape it with a real
Prometheus found through the kubelet's file_sd file, drive it from a load Job running
`slotune loadgen`, and fail a trial-shaped pod with a flag vLLM does not know. They share one
engine and run in file order: the bad-flag pod first, the engine's removal last, so that no
two vLLM processes run at once. The last tests check the kubelet's own rules (termination
message limits, phases, the mapping of pod paths) without a cluster.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slotune import models, render
from support.cluster import Cluster, wait_for
from support.engine import SERVED_NAME, TINY_MODEL, vllm_python
from support.image import kubelet_image, operator_image
from support.kubelet import (
    VLLM_COMMAND,
    ContainerConfigError,
    Executable,
    Image,
    Kubelet,
    PodDirs,
    localize,
    loopback_ip,
    operator_commands,
    plan_launch,
    pod_phase,
    projected_files,
    termination_message,
)
from support.prometheus import PrometheusServer, prometheus_binary

pytestmark = pytest.mark.integration

ENGINE_NAMESPACE = "kubelet-engine"
ENGINE_START_TIMEOUT = 600.0
TRIAL_LABEL = "slotune.dev/trial"


def _vllm_python_or_placeholder() -> Path:
    """The vLLM environment's python. Without it (the fast tests alone), vLLM pods simply
    cannot start: the kubelet reports CreateContainerError for them."""
    try:
        python: Path = vllm_python()
    except RuntimeError:
        return Path("/nonexistent/vllm-python")
    return python


@pytest.fixture(scope="module")
def kubelet(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubelet]:
    commands = {
        **operator_commands(_vllm_python_or_placeholder()),
        ("sh", "-c"): Executable(("/bin/sh", "-c")),
        ("python3", "-m", "http.server"): Executable(
            (sys.executable, "-m", "http.server"), append=("--bind", "{pod_ip}")
        ),
    }
    work_dir = tmp_path_factory.mktemp("kubelet")
    with Kubelet(
        cluster.kubeconfig,
        work_dir,
        commands,
        env={"PYTHONUNBUFFERED": "1"},
        images=[kubelet_image()],
    ) as node:
        yield node
    sys.stderr.write(f"\nKubelet work dir (pod logs): {work_dir}\n")


@pytest.fixture
def ns(cluster: Cluster, namespace: str, kubelet: Kubelet) -> Iterator[str]:
    """A namespace deleted after the test; the kubelet stops its pods meanwhile."""
    yield namespace
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def until(kubelet: Kubelet, what: str, probe: Callable[[], Any], timeout: float = 60) -> Any:
    """wait_for, with the end of every container log in the failure message."""
    try:
        return wait_for(what, probe, timeout=timeout)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{kubelet.log_tails()}") from None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def container_status(pod: dict[str, Any] | None) -> dict[str, Any]:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    status: dict[str, Any] = statuses[0]
    return status


def phase(pod: dict[str, Any] | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase", ""))


def pid_of(pod: dict[str, Any]) -> int:
    """The process behind the running container (its containerID is local://<pid>)."""
    return int(container_status(pod)["containerID"].removeprefix("local://"))


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def bare_pod(
    namespace: str, name: str, command: list[str], *, restart: str = "Never", **container: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": "busybox", "command": command, **container}],
        },
    }


def create(cluster: Cluster, obj: dict[str, Any]) -> None:
    result = cluster.apply(obj)
    assert result.returncode == 0, result.stderr


def pod_of_job(cluster: Cluster, namespace: str, job: str) -> dict[str, Any] | None:
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", f"job-name={job}", "-o", "json"
        ).stdout
    )["items"]
    return pods[0] if pods else None


def job_complete(cluster: Cluster, namespace: str, name: str) -> bool:
    return condition(cluster.get("job", name, namespace), "Complete").get("status") == "True"


# --- the node ---------------------------------------------------------------------------------


def test_registers_a_node_that_stays_ready(cluster: Cluster, kubelet: Kubelet) -> None:
    node = cluster.get("node", kubelet.node_name, "default")
    assert node is not None
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert condition(node, "Ready")["status"] == "True"

    def renewed_at() -> str:
        lease = cluster.get("lease", kubelet.node_name, "kube-node-lease")
        return str((lease or {}).get("spec", {}).get("renewTime", ""))

    first_renewal, first_heartbeat = renewed_at(), condition(node, "Ready")["lastHeartbeatTime"]
    until(kubelet, "a Lease renewal", lambda: renewed_at() not in ("", first_renewal), timeout=30)
    node = until(
        kubelet,
        "a Ready heartbeat",
        lambda: (
            (n := cluster.get("node", kubelet.node_name, "default"))
            and condition(n, "Ready")["lastHeartbeatTime"] != first_heartbeat
            and n
        ),
        timeout=30,
    )
    assert condition(node, "Ready")["status"] == "True"


# --- running commands -----------------------------------------------------------------------


def field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def test_job_completes_with_its_termination_message(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    """The Job controller sees its pod succeed; the pod's env (downward API), emptyDir and
    termination-message path all work as in a cluster."""
    script = (
        'echo "$POD_NAME ran on $NODE_NAME" > /dev/termination-log; '
        'echo kept > "$SCRATCH/note"; cat "$SCRATCH/note" >> /dev/termination-log'
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "hello", "namespace": ns},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "volumes": [{"name": "scratch", "emptyDir": {}}],
                    "containers": [
                        {
                            "name": "hello",
                            "image": "busybox",
                            "command": ["sh", "-c"],
                            "args": [script],
                            "env": [
                                {"name": "POD_NAME", **field("metadata.name")},
                                {"name": "NODE_NAME", **field("spec.nodeName")},
                                {"name": "SCRATCH", "value": "/scratch"},
                            ],
                            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                        }
                    ],
                }
            },
        },
    }
    create(cluster, job)
    until(kubelet, "the Job to complete", lambda: job_complete(cluster, ns, "hello"))

    pod = pod_of_job(cluster, ns, "hello")
    assert pod is not None
    assert phase(pod) == "Succeeded"
    terminated = container_status(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    name = pod["metadata"]["name"]
    assert terminated["message"] == f"{name} ran on {kubelet.node_name}\nkept\n"
    assert pod["status"]["podIP"].startswith("127.")
    assert pod["status"]["podIP"] != "127.0.0.1"


def image_job(namespace: str, name: str, script: str, **security: Any) -> dict[str, Any]:
    """A Job of the operator image, hardened as slotune's trial Job is."""
    context = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        **security,
    }
    short = operator_image().removeprefix("docker.io/")  # as the chart names it
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    "containers": [
                        {
                            "name": "main",
                            "image": short,
                            "command": ["sh", "-c"],
                            "args": [script],
                            "env": [{"name": "GREETING", "value": "from the image"}],
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                            "securityContext": context,
                        }
                    ],
                }
            },
        },
    }


def test_a_pod_of_the_operator_image_runs_as_a_real_container(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    """Its user, read-only root, capabilities, env, emptyDir and termination message are the
    container runtime's, as the pod declares them."""
    script = (
        '{ id -u; echo "$GREETING"; touch /opt/x 2>/dev/null && echo writable || echo read-only;'
        " echo kept > /tmp/note && cat /tmp/note; grep CapEff /proc/self/status;"
        " slotune --help >/dev/null && echo slotune runs; } > /dev/termination-log"
    )
    create(cluster, image_job(ns, "in-image", script))
    until(kubelet, "the Job to complete", lambda: job_complete(cluster, ns, "in-image"))
    pod = pod_of_job(cluster, ns, "in-image")
    assert pod is not None
    terminated = container_status(pod)["state"]["terminated"]
    assert terminated["exitCode"] == 0
    assert terminated["message"].splitlines() == [
        "65532",
        "from the image",
        "read-only",
        "kept",
        "CapEff:\t0000000000000000",
        "slotune runs",
    ]


WHO_AM_I = """
import json, os, ssl, urllib.request
account = "/var/run/secrets/kubernetes.io/serviceaccount"
env = os.environ
server = "https://%s:%s" % (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
request = urllib.request.Request(
    server + "/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=json.dumps(review).encode(), method="POST",
    headers={"Authorization": "Bearer " + open(account + "/token").read(),
             "Content-Type": "application/json"},
)
tls = ssl.create_default_context(cafile=account + "/ca.crt")
answer = json.load(urllib.request.urlopen(request, context=tls))
print(answer["status"]["userInfo"]["username"])
print(open(account + "/namespace").read())
try:
    open(account + "/token", "a")
except OSError:
    print("read-only")
"""


def test_a_pod_of_the_image_calls_the_api_server_as_its_service_account(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    """The ServiceAccount volume that admission adds to the pod (a projected token, the
    cluster's CA, the namespace) and the API server's address, as a kubelet gives them: what
    the operator's pod of `helm install` logs in with."""
    job = image_job(ns, "who-am-i", 'python3 -c "$SCRIPT" > /dev/termination-log')
    job["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "SCRIPT", "value": WHO_AM_I}
    )
    create(cluster, job)
    until(kubelet, "the Job to complete", lambda: job_complete(cluster, ns, "who-am-i"))
    pod = pod_of_job(cluster, ns, "who-am-i")
    assert pod is not None
    projected = [v for v in pod["spec"]["volumes"] if "projected" in v]
    assert projected, "ServiceAccount admission adds the token volume"
    terminated = container_status(pod)["state"]["terminated"]
    assert terminated["exitCode"] == 0, terminated
    assert terminated["message"].splitlines() == [
        f"system:serviceaccount:{ns}:default",
        ns,
        "read-only",
    ]


def test_a_killed_container_of_an_always_pod_restarts(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    create(cluster, bare_pod(ns, "killed", ["sh", "-c", "sleep 300"], restart="Always"))
    until(
        kubelet,
        "the container to run",
        lambda: phase(cluster.get("pod", "killed", ns)) == "Running",
    )
    kubelet.kill_container(ns, "killed", "main")
    pod = until(
        kubelet,
        "a restart",
        lambda: (
            (p := cluster.get("pod", "killed", ns))
            and container_status(p).get("restartCount", 0) == 1
            and "running" in container_status(p)["state"]
            and p
        ),
    )
    assert container_status(pod)["lastState"]["terminated"]["exitCode"] == 137  # 128 + SIGKILL
    assert kubelet.restarts(ns, "killed", "main") == 1


def test_run_as_non_root_refuses_root_as_a_kubelet_does(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    create(cluster, image_job(ns, "as-root", "id -u", runAsUser=0))
    pod = until(
        kubelet,
        "CreateContainerConfigError",
        lambda: (
            (p := pod_of_job(cluster, ns, "as-root"))
            and container_status(p).get("state", {}).get("waiting", {}).get("reason")
            == "CreateContainerConfigError"
            and p
        ),
    )
    assert "will run as root" in container_status(pod)["state"]["waiting"]["message"]


def test_a_command_it_cannot_run_waits_with_create_container_error(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    create(cluster, bare_pod(ns, "nginx", ["nginx", "-g", "daemon off;"], restart="Always"))
    pod = until(
        kubelet,
        "CreateContainerError",
        lambda: (
            (p := cluster.get("pod", "nginx", ns))
            and container_status(p).get("state", {}).get("waiting", {}).get("reason")
            == "CreateContainerError"
            and p
        ),
    )
    assert "nginx -g" in container_status(pod)["state"]["waiting"]["message"]
    assert phase(pod) == "Pending"


def test_a_crashing_container_restarts_with_back_off(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    create(cluster, bare_pod(ns, "crash", ["sh", "-c", "echo crashed; exit 3"], restart="Always"))
    pod = until(
        kubelet,
        "two restarts",
        lambda: (
            (p := cluster.get("pod", "crash", ns))
            and container_status(p).get("restartCount", 0) >= 2
            and p
        ),
    )
    status = container_status(pod)
    assert phase(pod) == "Running"
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"
    assert condition(pod, "Ready")["status"] == "False"
    assert "crashed\ncrashed\n" in kubelet.logs(ns, "crash", "main")


def test_ready_follows_the_readiness_probe(cluster: Cluster, kubelet: Kubelet, ns: str) -> None:
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    ports = [{"name": "http", "containerPort": 8080}]
    server = ["python3", "-m", "http.server", "8080"]
    create(cluster, bare_pod(ns, "web", server, ports=ports, readinessProbe=probe))
    # Nothing listens in this one: it runs, but never becomes Ready.
    create(
        cluster, bare_pod(ns, "deaf", ["sh", "-c", "sleep 600"], ports=ports, readinessProbe=probe)
    )
    pod = until(
        kubelet,
        "Ready",
        lambda: (
            (p := cluster.get("pod", "web", ns))
            and condition(p, "Ready").get("status") == "True"
            and p
        ),
    )
    assert condition(pod, "ContainersReady")["status"] == "True"
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/", timeout=5) as answer:
        assert answer.status == 200

    deaf = cluster.get("pod", "deaf", ns)
    assert phase(deaf) == "Running"
    assert condition(deaf, "Ready")["status"] == "False"
    assert condition(deaf, "Ready")["reason"] == "ContainersNotReady"
    assert container_status(deaf)["ready"] is False


def test_a_failing_startup_probe_kills_the_container(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    never_up = {
        "httpGet": {"path": "/health", "port": 8000},
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    create(cluster, bare_pod(ns, "stuck", ["sh", "-c", "sleep 600"], startupProbe=never_up))
    pod = until(
        kubelet,
        "the pod to fail",
        lambda: phase(p := cluster.get("pod", "stuck", ns)) == "Failed" and p,
    )
    terminated = container_status(pod)["state"]["terminated"]
    assert terminated["exitCode"] == 128 + 15  # SIGTERM
    assert container_status(pod)["started"] is False


def test_deleting_a_pod_stops_its_processes_after_the_grace_period(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    # The shell and its sleep ignore SIGTERM: only the SIGKILL after the grace period ends them.
    create(cluster, bare_pod(ns, "stubborn", ["sh", "-c", "trap '' TERM; sleep 600"]))
    pod = until(
        kubelet,
        "Running",
        lambda: phase(p := cluster.get("pod", "stubborn", ns)) == "Running" and p,
    )
    pid = pid_of(pod)
    assert group_alive(pid)
    cluster.kubectl("delete", "pod", "stubborn", "-n", ns, "--wait=false")
    until(kubelet, "the pod to be gone", lambda: cluster.get("pod", "stubborn", ns) is None)
    assert not group_alive(pid)


def test_injected_fault_fails_only_the_matching_pods(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    """A trial pod, shaped as the operator renders it, on a node where its configuration
    cannot run; the pod next to it is unaffected."""
    kubelet.fail_pods(
        lambda pod: pod["metadata"].get("labels", {}).get(TRIAL_LABEL) == "7",
        "torch.OutOfMemoryError: CUDA out of memory (injected)",
    )
    try:
        create(cluster, trial_pod(ns, "trial-7", [], labels={TRIAL_LABEL: "7"}))
        create(cluster, bare_pod(ns, "bystander", ["sh", "-c", "sleep 600"]))
        pod = until(
            kubelet,
            "the trial to fail",
            lambda: phase(p := cluster.get("pod", "trial-7", ns)) == "Failed" and p,
        )
        terminated = container_status(pod)["state"]["terminated"]
        assert terminated["exitCode"] == 1
        assert "CUDA out of memory (injected)" in terminated["message"]
        until(
            kubelet,
            "the bystander to run",
            lambda: phase(cluster.get("pod", "bystander", ns)) == "Running",
        )
    finally:
        kubelet.clear_faults()


# --- the real vLLM engine ------------------------------------------------------------------


ENGINE_ARGS = [
    "--model", str(TINY_MODEL), "--served-model-name", SERVED_NAME,
    "--host", "0.0.0.0", "--port", "8000",
    "--load-format", "dummy", "--skip-tokenizer-init", "--max-model-len", "2048",
]  # fmt: skip


def engine_container(extra_args: list[str]) -> dict[str, Any]:
    """The engine container as the operator renders it, serving the tiny model with random
    weights; probes tightened so that the test does not wait on long periods."""
    health = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    return {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.32.0",
        "command": list(VLLM_COMMAND),
        "args": [*ENGINE_ARGS, *extra_args],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "env": [
            {"name": "HF_HOME", "value": "/root/.cache/huggingface"},
            {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
        ],
        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "cache", "mountPath": "/root/.cache"},
        ],
        "startupProbe": {**health, "periodSeconds": 2, "failureThreshold": 300},
        "readinessProbe": {**health, "periodSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
    }


ENGINE_VOLUMES = [
    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
    {"name": "cache", "emptyDir": {}},
]


def trial_pod(
    namespace: str, name: str, extra_args: list[str], labels: dict[str, str]
) -> dict[str, Any]:
    """A trial pod as render_trial_pod makes it: never restarted, the log tail as its
    termination message on failure, no liveness probe."""
    container = engine_container(extra_args)
    container.pop("livenessProbe")
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 60,
            "containers": [container],
            "volumes": ENGINE_VOLUMES,
        },
    }


@pytest.mark.engine
def test_a_trial_pod_with_a_flag_vllm_lacks_fails_with_its_log_tail(
    cluster: Cluster, kubelet: Kubelet, ns: str
) -> None:
    create(cluster, trial_pod(ns, "trial-1", ["--chunked-prefill-size", "512"], labels={}))
    pod = until(
        kubelet,
        "the trial to fail",
        lambda: phase(p := cluster.get("pod", "trial-1", ns)) == "Failed" and p,
        timeout=300,
    )
    terminated = container_status(pod)["state"]["terminated"]
    assert terminated["exitCode"] != 0
    assert terminated["reason"] == "Error"
    assert "unrecognized arguments: --chunked-prefill-size" in terminated["message"]
    assert len(terminated["message"].encode()) <= 2048


@pytest.fixture(scope="module")
def engine(cluster: Cluster, kubelet: Kubelet) -> Iterator[dict[str, Any]]:
    """A Deployment of one engine pod, available: its pod Ready through the probes."""
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "tiny"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "tiny", "namespace": ENGINE_NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "8000",
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "containers": [engine_container([])],
                    "volumes": ENGINE_VOLUMES,
                    "terminationGracePeriodSeconds": 60,
                },
            },
        },
    }
    cluster.kubectl("create", "namespace", ENGINE_NAMESPACE)
    try:
        create(cluster, deployment)
        until(
            kubelet,
            "the engine Deployment to be available",
            lambda: (
                (
                    (cluster.get("deployment", "tiny", ENGINE_NAMESPACE) or {}).get("status") or {}
                ).get("availableReplicas")
                == 1
            ),
            timeout=ENGINE_START_TIMEOUT,
        )
        yield engine_pod(cluster)
    finally:
        cluster.kubectl("delete", "namespace", ENGINE_NAMESPACE, "--timeout=120s")


def engine_pod(cluster: Cluster) -> dict[str, Any]:
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-n", ENGINE_NAMESPACE, "-l", "app.kubernetes.io/instance=tiny",
            "-o", "json",
        ).stdout
    )["items"]  # fmt: skip
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    pod: dict[str, Any] = pods[0]
    return pod


def complete(url: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    request = urllib.request.Request(  # noqa: S310 - the pod's http URL
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310
        answer: dict[str, Any] = json.loads(response.read())
    return answer


@pytest.mark.engine
def test_engine_deployment_becomes_ready_and_serves_at_its_pod_ip(
    kubelet: Kubelet, engine: dict[str, Any]
) -> None:
    assert condition(engine, "Ready")["status"] == "True"
    ip = engine["status"]["podIP"]
    assert ip.startswith("127.")
    assert ip != "127.0.0.1"
    answer = complete(f"http://{ip}:8000", [1, 2, 3, 4, 5], max_tokens=4)
    assert answer["usage"]["completion_tokens"] == 4


@pytest.mark.engine
def test_prometheus_finds_the_engine_through_the_file_sd_file(
    kubelet: Kubelet, engine: dict[str, Any], tmp_path: Path
) -> None:
    target = f"{engine['status']['podIP']}:8000"
    name = engine["metadata"]["name"]
    groups = json.loads(kubelet.file_sd.read_text())
    group = next(g for g in groups if g["targets"] == [target])
    assert group["labels"] == {
        "namespace": ENGINE_NAMESPACE,
        "pod": name,
        "container": "vllm",
        "app_kubernetes_io_name": "vllm",
        "app_kubernetes_io_instance": "tiny",
        "pod_template_hash": engine["metadata"]["labels"]["pod-template-hash"],
        "__metrics_path__": "/metrics",
    }
    with PrometheusServer(
        prometheus_binary(install=True), tmp_path, file_sd=kubelet.file_sd
    ) as prometheus:
        prometheus.wait_for_target_up(targets=[target])
        series = prometheus.api(
            "query", query=f'vllm:num_requests_running{{pod="{name}",container="vllm"}}'
        )["result"]
    assert [s["metric"]["namespace"] for s in series] == [ENGINE_NAMESPACE]
    assert series[0]["metric"]["model_name"] == SERVED_NAME


@pytest.mark.engine
def test_a_load_job_reports_its_measurement_in_the_termination_message(
    cluster: Cluster, kubelet: Kubelet, engine: dict[str, Any]
) -> None:
    """The shape of the operator's load Job: `slotune ...` writing its result to
    /dev/termination-log, read back from the pod's status."""
    url = f"http://{engine['status']['podIP']}:8000"
    load_args = [
        "loadgen", "--url", url, "--model", SERVED_NAME, "--concurrency", "1",
        "--num-requests", "2", "--prompt-tokens", "8", "--output-tokens", "4",
        "--json", "/dev/termination-log",
    ]  # fmt: skip
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "load", "namespace": ENGINE_NAMESPACE},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "load",
                            "image": "ghcr.io/slotune/slotune:dev",
                            "command": ["slotune"],
                            "args": load_args,
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                        }
                    ],
                }
            },
        },
    }
    create(cluster, job)
    until(
        kubelet,
        "the load Job to complete",
        lambda: job_complete(cluster, ENGINE_NAMESPACE, "load"),
        timeout=180,
    )
    pod = pod_of_job(cluster, ENGINE_NAMESPACE, "load")
    summary = json.loads(container_status(pod)["state"]["terminated"]["message"])
    assert (summary["completed"], summary["failed"]) == (2, 0)


@pytest.mark.engine
def test_scaling_the_deployment_to_zero_stops_the_engine(
    cluster: Cluster, kubelet: Kubelet, engine: dict[str, Any]
) -> None:
    pid = pid_of(engine)
    assert group_alive(pid)
    cluster.kubectl("scale", "deployment", "tiny", "-n", ENGINE_NAMESPACE, "--replicas=0")
    name = engine["metadata"]["name"]
    until(
        kubelet,
        "the engine pod to be gone",
        lambda: cluster.get("pod", name, ENGINE_NAMESPACE) is None,
        timeout=90,
    )
    assert not group_alive(pid)
    target = f"{engine['status']['podIP']}:8000"
    until(
        kubelet,
        "the file_sd file to drop the engine",
        lambda: all(target not in g["targets"] for g in json.loads(kubelet.file_sd.read_text())),
        timeout=10,
    )


# --- the kubelet's rules, without a cluster -------------------------------------------------


def test_termination_message_follows_the_kubelet_limits() -> None:
    log = b"".join(b"line %d\n" % i for i in range(200))
    assert termination_message(b"result", log, fallback_to_logs=True, exit_code=1) == "result"
    assert termination_message(b"", log, fallback_to_logs=True, exit_code=0) == ""
    assert termination_message(b"", log, fallback_to_logs=False, exit_code=1) == ""
    tail = termination_message(b"", log, fallback_to_logs=True, exit_code=1)
    assert tail.splitlines() == [f"line {i}" for i in range(120, 200)]  # the last 80 lines
    long_lines = b"x" * 100 + b"\n" + b"y" * 3000 + b"\n"
    tail = termination_message(b"", long_lines, fallback_to_logs=True, exit_code=1)
    assert tail == "y" * 2047 + "\n"  # at most 2 KiB
    written = b"a" * 1000 + b"b" * 4096
    assert termination_message(written, b"", fallback_to_logs=True, exit_code=0) == "b" * 4096


def test_a_projected_service_account_volume_as_the_kubelet_writes_it() -> None:
    """The volume ServiceAccount admission adds: a bound token, the CA, the namespace."""
    pod = {
        "metadata": {"name": "p", "namespace": "team", "uid": "u1"},
        "spec": {"serviceAccountName": "slotune"},
    }
    volume = {
        "name": "kube-api-access-x",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                                            "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]
        },
    }  # fmt: skip
    asked: list[tuple[str, int]] = []

    def token(pod: dict[str, Any], source: dict[str, Any]) -> str:
        asked.append((pod["metadata"]["uid"], source["expirationSeconds"]))
        return "t0ken"

    def lookup(resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = (resource, namespace, name) == ("configmaps", "team", "kube-root-ca.crt")
        return {"data": {"ca.crt": "PEM"}} if found else None

    files = projected_files(pod, volume, pod_ip="127.0.0.5", lookup=lookup, token=token)
    assert files == {"token": "t0ken", "ca.crt": "PEM", "namespace": "team"}
    assert asked == [("u1", 3607)]
    # Without the CA's ConfigMap (not yet published) the container cannot be created yet.
    with pytest.raises(ContainerConfigError, match=r"kube-root-ca\.crt"):
        projected_files(pod, volume, pod_ip="127.0.0.5", lookup=lambda *_: None, token=token)


def test_pod_paths_become_local_paths() -> None:
    termination = ("/dev/termination-log", "/work/p/load.termination-log")
    mounts = [("/root/.cache", "/work/p/volumes/cache")]
    assert localize("/root/.cache", termination, mounts) == "/work/p/volumes/cache"
    assert localize("/root/.cache/hf", termination, mounts) == "/work/p/volumes/cache/hf"
    assert localize("--download-dir=/root/.cache/hf", termination, mounts) == (
        "--download-dir=/work/p/volumes/cache/hf"
    )
    assert localize("/root/.cachex", termination, mounts) == "/root/.cachex"
    assert localize("echo 1 > /dev/termination-log", termination, mounts) == (
        "echo 1 > /work/p/load.termination-log"
    )


def test_launch_of_an_engine_pod(tmp_path: Path) -> None:
    pod = trial_pod("ns", "trial-3", ["--max-num-seqs", "8"], labels={})
    pod["metadata"]["uid"] = "uid-3"
    pod["spec"]["containers"][0]["env"].append(
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    )
    launch = plan_launch(
        pod,
        pod["spec"]["containers"][0],
        pod_ip="127.0.0.9",
        commands=operator_commands(Path("/venv/bin/python")),
        dirs=PodDirs(tmp_path, tmp_path / "claims"),
        host_env={"PATH": "/bin"},
        lookup=lambda *_: None,
    )
    assert launch.argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert launch.argv[-4:] == ["--max-num-seqs", "8", "--host", "127.0.0.9"]
    assert launch.env["HF_HOME"] == str(tmp_path / "volumes" / "cache" / "huggingface")
    assert launch.env["POD_IP"] == "127.0.0.9"
    assert launch.env["PATH"] == "/bin"


def test_pods_that_mount_one_claim_share_its_folder(tmp_path: Path) -> None:
    """A ReadWriteMany cache claim (`spec.cache`): two trial pods' caches land in the one folder
    of the claim, as on a node where both mount it."""
    owner = render.Owner(name="chat", namespace="ns", uid="u")
    spec = models.LLMDeploymentSpec.model_validate(
        {"model": {"name": "tiny"}, "cache": {"pvc": {"claimName": "llm-cache"}}}
    )
    claims = tmp_path / "claims"
    envs = []
    for trial in (1, 2):
        pod = render.render_trial_pod(owner, spec, {}, 1, trial)
        pod["metadata"]["uid"] = f"uid-{trial}"
        dirs = PodDirs(tmp_path / f"trial-{trial}", claims)
        launch = plan_launch(
            pod,
            pod["spec"]["containers"][0],
            pod_ip=loopback_ip(trial),
            commands=operator_commands(Path("/venv/bin/python")),
            dirs=dirs,
            host_env={"PATH": "/bin"},
            lookup=lambda *_: None,
        )
        envs.append(launch.env)
    shared = claims / "ns" / "llm-cache"
    for env in envs:
        assert env["HF_HOME"] == str(shared / "huggingface")
        assert env["VLLM_CACHE_ROOT"] == str(shared / "vllm")
        assert env["TORCHINDUCTOR_CACHE_DIR"] == str(shared / "torchinductor")
        assert env["TRITON_CACHE_DIR"] == str(shared / "triton")


def test_a_container_is_named_and_killed_by_its_own_name_whatever_it_mounts(
    tmp_path: Path,
) -> None:
    """The runtime's name of an image's container is the one `podman run --name` got, and the
    one a kill and the clean-up use, however many volumes it mounts (a projected token and an
    emptyDir here, as the operator's pod has)."""
    image = Image(name="docker.io/slotune/operator:0.1.0", user="1000")
    pod: dict[str, Any] = {
        "metadata": {"name": "op", "namespace": "ns", "uid": "uid-op"},
        "spec": {
            "volumes": [
                {"name": "tmp", "emptyDir": {}},
                {"name": "kube-api-access-x", "projected": {"sources": []}},
            ],
            "containers": [
                {
                    "name": "operator",
                    "image": "slotune/operator:0.1.0",
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/x"},
                    ],
                }
            ],
        },
    }
    launch = plan_launch(
        pod,
        pod["spec"]["containers"][0],
        pod_ip="127.0.0.9",
        commands={},
        dirs=PodDirs(tmp_path, tmp_path / "claims"),
        host_env={"PATH": "/bin"},
        lookup=lambda *_: None,
        images={image.name: image},
    )
    named = launch.argv[launch.argv.index("--name") + 1]
    assert "operator" in named
    assert launch.container_id == f"podman://{named}"
    assert launch.cleanup[-1] == named


def test_phase_as_the_kubelet_decides_it() -> None:
    running: dict[str, Any] = {"running": {}}
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    ok, failed = {"terminated": {"exitCode": 0}}, {"terminated": {"exitCode": 1}}
    assert pod_phase("Never", [(waiting, {})]) == "Pending"
    assert pod_phase("Never", [(running, {}), (ok, {})]) == "Running"
    assert pod_phase("Never", [(ok, {}), (failed, {})]) == "Failed"
    assert pod_phase("OnFailure", [(ok, {})]) == "Succeeded"
    assert pod_phase("OnFailure", [(waiting, failed)]) == "Running"
    assert pod_phase("Always", [(ok, {})]) == "Running"
    assert [loopback_ip(i) for i in (1, 253, 254)] == ["127.0.0.2", "127.0.0.254", "127.0.1.1"]
