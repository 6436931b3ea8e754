"""slotune's objects of the platform projects' kinds against those projects' own CRDs, fetched
from their pinned Go modules (tests/support/platform_crds.py): the API server takes each as
slotune renders it and prunes nothing (a structural schema drops an unknown field silently, so
a typo would pass unseen), and the operator, under the chart's RBAC, applies and removes them.

The Prometheus Operator itself (scripts/build-prometheus-operator.sh) then turns slotune's
PodMonitors and the chart's PrometheusRule into Prometheus configuration: a scrape job per
PodMonitor that, relabelled as Prometheus relabels a serving pod's target (the pod's labels and
named port, as slotune renders the Deployment), keeps that target on the engine's port and
`/metrics` and drops a trial pod's; and the rule files Prometheus loads, holding every alert.

The control plane is the module's own, so that the session's cluster stays one without these
CRDs, as most clusters are.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slotune import models, render
from support.cluster import ROOT, Cluster, OperatorProcess, llmd, wait_for
from support.controlplane import ControlPlane, bin_dir_from_env
from support.platform_crds import install_platform_crds
from support.prometheus_operator import PrometheusOperator

pytestmark = pytest.mark.integration

EPP = {"name": "chat-epp", "port": 9002}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane with slotune's CRD and every platform CRD established."""
    bin_dir = bin_dir_from_env()
    with ControlPlane(bin_dir, tmp_path_factory.mktemp("platform-plane")) as plane:
        cluster = Cluster(plane, bin_dir)
        cluster.install_crd()
        install_platform_crds(cluster)
        yield cluster


@pytest.fixture(scope="module")
def platform_operator(
    platform: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator on that control plane, under the chart's ServiceAccount and ClusterRole."""
    work = tmp_path_factory.mktemp("platform-operator")
    process = OperatorProcess(platform.install_operator_rbac(work / "kubeconfig"), work / "log")
    process.start()
    yield process
    process.stop()
    sys.stderr.write(f"\nOperator log: {process.log_path}\n")


def stored_llmd(cluster: Cluster, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """An LLMDeployment applied, as the server holds it (its uid to own children)."""
    cluster.kubectl("create", "namespace", namespace)
    applied = cluster.apply(llmd(name, namespace, **spec))
    assert applied.returncode == 0, applied.stderr
    found = cluster.get("llmd", name, namespace)
    assert found is not None
    return found


def owner_of(obj: dict[str, Any]) -> render.Owner:
    meta = obj["metadata"]
    return render.Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


@pytest.mark.parametrize(
    ("namespace", "pool"),
    [
        ("pool-no-epp", {"enabled": True}),
        ("pool-epp", {"enabled": True, "endpointPickerRef": EPP}),
        (
            "pool-fail-open",
            {"enabled": True, "endpointPickerRef": {**EPP, "failureMode": "FailOpen"}},
        ),
    ],
)
def test_the_inference_pool_is_stored_as_rendered(
    platform: Cluster, namespace: str, pool: dict[str, Any]
) -> None:
    # A real owner: the garbage collector deletes a child whose owner does not exist.
    body = stored_llmd(platform, "chat", namespace)
    spec = models.LLMDeploymentSpec.model_validate({**body["spec"], "inferencePool": pool})
    rendered = render.render_inference_pool(owner_of(body), spec)

    result = platform.apply(rendered, "--server-side", "--field-manager=slotune")
    assert result.returncode == 0, result.stderr
    stored = platform.get("inferencepool", "chat", namespace)
    assert stored is not None
    assert stored["spec"] == rendered["spec"]  # nothing pruned, nothing defaulted beside it
    assert stored["metadata"]["ownerReferences"] == rendered["metadata"]["ownerReferences"]
    assert rendered["metadata"]["labels"].items() <= stored["metadata"]["labels"].items()


def test_the_operator_applies_the_pool_and_removes_it_when_switched_off(
    platform: Cluster, platform_operator: OperatorProcess
) -> None:
    namespace = "pool-operator"
    body = stored_llmd(
        platform, "chat", namespace, inferencePool={"enabled": True, "endpointPickerRef": EPP}
    )
    uid = body["metadata"]["uid"]

    def ours() -> dict[str, Any] | None:
        pool = platform.get("inferencepool", "chat", namespace)
        refs = (pool or {}).get("metadata", {}).get("ownerReferences") or []
        return pool if any(r["uid"] == uid and r.get("controller") for r in refs) else None

    pool = wait_for("the InferencePool owned by the LLMDeployment", ours)
    spec = models.LLMDeploymentSpec.model_validate(body["spec"])
    assert pool["spec"] == render.render_inference_pool(owner_of(body), spec)["spec"]

    patch = {"spec": {"inferencePool": {"enabled": False}}}
    platform.kubectl(
        "patch", "llmd", "chat", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
    )
    wait_for(
        "the InferencePool to be deleted",
        lambda: platform.get("inferencepool", "chat", namespace) is None,
    )


CHART = ROOT / "charts" / "slotune"
CHART_NAMESPACE = "slotune-system"
MONITORING = "monitoring"
APP = "metrics"
CHART_MONITORING = [
    "monitoring.operatorPodMonitor.enabled=true",
    "monitoring.vllmPodMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
]
PROMETHEUS = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "Prometheus",
    "metadata": {"name": "k8s", "namespace": MONITORING},
    "spec": {
        # Every PodMonitor and rule in every namespace, as a cluster's main Prometheus.
        "podMonitorSelector": {},
        "podMonitorNamespaceSelector": {},
        "ruleSelector": {},
        "ruleNamespaceSelector": {},
    },
}


def chart_objects(cluster: Cluster) -> list[dict[str, Any]]:
    args = ["template", "slotune", str(CHART), "-n", CHART_NAMESPACE]
    for item in CHART_MONITORING:
        args += ["--set", item]
    docs = [d for d in yaml.safe_load_all(cluster.helm(*args)) if d]
    return [d for d in docs if d["kind"] in {"PodMonitor", "PrometheusRule"}]


@pytest.fixture(scope="module")
def monitored(
    platform: Cluster, platform_operator: OperatorProcess
) -> tuple[render.Owner, models.LLMDeploymentSpec, dict[str, Any]]:
    """An LLMDeployment with the PodMonitor the operator made for it (`podMonitor: Auto`, the
    CRD being there), and the chart's and the Prometheus object's namespaces."""
    platform.kubectl("create", "namespace", MONITORING)  # the chart's came with its RBAC
    body = stored_llmd(platform, "chat", APP)
    uid = body["metadata"]["uid"]

    def ours() -> dict[str, Any] | None:
        monitor = platform.get("podmonitor", "chat", APP)
        refs = (monitor or {}).get("metadata", {}).get("ownerReferences") or []
        return monitor if any(r["uid"] == uid and r.get("controller") for r in refs) else None

    monitor = wait_for("the PodMonitor owned by the LLMDeployment", ours)
    return owner_of(body), models.LLMDeploymentSpec.model_validate(body["spec"]), monitor


def contained(sent: Any, stored: Any) -> bool:
    """Whether everything sent is stored as sent: a field pruned is missing, while a field the
    schema defaults (a relabeling's `action: replace`) may be added beside."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(
            key in stored and contained(value, stored[key]) for key, value in sent.items()
        )
    if isinstance(sent, list):
        return (
            isinstance(stored, list)
            and len(sent) == len(stored)
            and all(contained(a, b) for a, b in zip(sent, stored, strict=True))
        )
    return bool(sent == stored)


def apply_and_read_back(cluster: Cluster, obj: dict[str, Any]) -> dict[str, Any]:
    applied = cluster.apply(obj, "--server-side")
    assert applied.returncode == 0, applied.stderr
    meta = obj["metadata"]
    stored = cluster.get(obj["kind"].lower(), meta["name"], meta["namespace"])
    assert stored is not None
    return stored


def test_the_monitoring_objects_are_stored_as_rendered(
    platform: Cluster, monitored: tuple[render.Owner, models.LLMDeploymentSpec, dict[str, Any]]
) -> None:
    owner, spec, made = monitored
    assert made["spec"] == render.render_pod_monitor(owner, spec)["spec"]
    objects = chart_objects(platform)
    assert sorted(o["kind"] for o in objects) == ["PodMonitor", "PodMonitor", "PrometheusRule"]
    for obj in objects:
        stored = apply_and_read_back(platform, obj)
        assert contained(obj["spec"], stored["spec"]), (obj["spec"], stored["spec"])


def meta_labels(pod: dict[str, Any], port: str) -> dict[str, str]:
    """The discovery labels Prometheus's pod role gives a pod's target on a named port."""

    def name(label: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", label)

    labels = {
        "__meta_kubernetes_namespace": pod["metadata"]["namespace"],
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
        "__meta_kubernetes_pod_container_port_name": port,
        "__meta_kubernetes_pod_container_name": pod["spec"]["containers"][0]["name"],
    }
    for key, value in pod["metadata"]["labels"].items():
        labels[f"__meta_kubernetes_pod_label_{name(key)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{name(key)}"] = "true"
    return labels


def dropped_by(job: dict[str, Any], labels: dict[str, str]) -> dict[str, Any] | None:
    """The first of the job's relabelings that drops a target with these labels, or None when
    the target is kept: the job's rules applied in order as Prometheus applies them (`keep`,
    `drop`, and `replace` and `hashmod`, which write the labels later rules read; the other
    actions write none that the operator's filters read)."""
    labels = dict(labels)
    for rule in job.get("relabel_configs", []):
        action = rule.get("action", "replace")
        value = rule.get("separator", ";").join(
            labels.get(s, "") for s in rule.get("source_labels", [])
        )
        matched = re.fullmatch(rule.get("regex", "(.*)"), value)
        if action in {"keep", "drop"} and (matched is not None) != (action == "keep"):
            return dict(rule)
        if action == "hashmod":
            digest = hashlib.md5(value.encode()).digest()  # noqa: S324 - Prometheus's hash
            labels[rule["target_label"]] = str(int.from_bytes(digest[8:]) % rule["modulus"])
        if action == "replace" and matched is not None and "target_label" in rule:
            groups = (matched.group(0), *matched.groups())
            replaced = re.sub(
                r"\$\{?(\d+)\}?",
                lambda g, groups=groups: groups[int(g.group(1))] or "",
                rule.get("replacement", "$1"),
            )
            labels[rule["target_label"]] = replaced
    return None


def pod_of(deployment: dict[str, Any], namespace: str) -> dict[str, Any]:
    template = deployment["spec"]["template"]
    return {"metadata": {**template["metadata"], "namespace": namespace}, "spec": template["spec"]}


def test_the_prometheus_operator_scrapes_the_engines_port_and_path(
    platform: Cluster,
    monitored: tuple[render.Owner, models.LLMDeploymentSpec, dict[str, Any]],
    tmp_path: Path,
) -> None:
    owner, spec, _ = monitored
    for obj in chart_objects(platform):
        apply_and_read_back(platform, obj)
    with PrometheusOperator(platform, tmp_path) as operator:
        assert platform.apply(PROMETHEUS).returncode == 0
        config = operator.configuration(MONITORING, "k8s")
    # The config reloader beside Prometheus expands $(SHARD) from the pod's environment: 0 in
    # the first (and here only) shard.
    config = json.loads(json.dumps(config).replace("$(SHARD)", "0"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    serving = pod_of(render.render_deployment(owner, spec, annotate_for_scraping=False), APP)
    target = meta_labels(serving, render.PORT_NAME)
    for name in (f"podMonitor/{APP}/chat/0", f"podMonitor/{CHART_NAMESPACE}/slotune-vllm/0"):
        job = jobs[name]
        assert job["metrics_path"] == "/metrics", name
        assert job.get("scheme", "http") == "http", name
        assert dropped_by(job, target) is None, (name, job["relabel_configs"])
        assert dropped_by(job, {**target, "__meta_kubernetes_pod_container_port_name": "grpc"})
        # Serving pods only: a trial engine's pod is not a user-facing replica.
        trial_pod = render.render_trial_pod(owner, spec, {}, study=1, trial=2)
        trial = meta_labels({**trial_pod, "metadata": {**trial_pod["metadata"], "namespace": APP}},
                            render.PORT_NAME)  # fmt: skip
        assert dropped_by(job, trial), f"{name} keeps a trial pod's target"


def test_the_prometheus_operator_loads_the_alert_rules(
    platform: Cluster,
    monitored: tuple[render.Owner, models.LLMDeploymentSpec, dict[str, Any]],
    tmp_path: Path,
) -> None:
    (rule,) = [o for o in chart_objects(platform) if o["kind"] == "PrometheusRule"]
    apply_and_read_back(platform, rule)
    with PrometheusOperator(platform, tmp_path) as operator:
        assert platform.apply(PROMETHEUS).returncode == 0
        files = operator.rule_files(MONITORING, "k8s")
    loaded = {
        r["alert"] for f in files.values() for g in f["groups"] for r in g["rules"] if "alert" in r
    }
    sent = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert sent
    assert sent <= loaded, sorted(sent - loaded)
