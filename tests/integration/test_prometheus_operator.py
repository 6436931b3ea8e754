"""slotune's monitoring objects meet the Prometheus Operator for real: its CRDs (from its Go
module, scripts/fetch-platform-crds.sh) on the test API server, and the operator itself
(scripts/build-prometheus-operator.sh) turning them into Prometheus configuration.

- The chart's PodMonitors and PrometheusRule and the PodMonitor the operator renders for an
  `LLMDeployment` are accepted by the real CRDs' schemas and stored as sent: no field pruned
  (a structural schema drops an unknown field silently, so a typo would pass unseen).
- The Prometheus Operator writes a scrape job for each PodMonitor; relabelled as Prometheus
  would relabel a serving pod's target (the pod's labels and named port, as slotune renders
  the Deployment), the job keeps that target, on the engine's port and `/metrics`. A trial pod
  is not kept by the vLLM PodMonitor's job.
- It writes the PrometheusRule's alerts into the rule files Prometheus loads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.specs import llm_spec

from slotune import models, render
from support.cluster import ROOT, Cluster
from support.controlplane import ControlPlane, bin_dir_from_env
from support.platform_crds import install_platform_crds
from support.prometheus_operator import PrometheusOperator

pytestmark = pytest.mark.integration

CHART = ROOT / "charts" / "slotune"
CHART_NAMESPACE = "slotune-system"
MONITORING = "monitoring"
APP = "serving-ns"
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane of its own, with the platform CRDs (the session cluster has none, and
    other tests count on that)."""
    bin_dir = bin_dir_from_env()
    with ControlPlane(bin_dir, tmp_path_factory.mktemp("platform-plane")) as plane:
        c = Cluster(plane, bin_dir)
        c.install_crd()
        install_platform_crds(c)
        for namespace in (CHART_NAMESPACE, MONITORING, APP):
            c.kubectl("create", "namespace", namespace)
        yield c


def chart_objects(cluster: Cluster) -> list[dict[str, Any]]:
    args = ["template", "slotune", str(CHART), "-n", CHART_NAMESPACE]
    for item in CHART_MONITORING:
        args += ["--set", item]
    docs = [d for d in yaml.safe_load_all(cluster.helm(*args)) if d]
    return [d for d in docs if d["kind"] in {"PodMonitor", "PrometheusRule"}]


@pytest.fixture(scope="module")
def llmd(cluster: Cluster) -> tuple[render.Owner, models.LLMDeploymentSpec]:
    """An LLMDeployment in the API server (its children's owner must exist, or the garbage
    collector removes them), with no slotune operator running: the test renders its children."""
    spec = llm_spec()
    body = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "chat", "namespace": APP},
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_defaults=True),
    }
    applied = cluster.apply(body)
    assert applied.returncode == 0, applied.stderr
    stored = cluster.get("llmd", "chat", APP)
    assert stored is not None
    return render.Owner("chat", APP, stored["metadata"]["uid"]), spec


def apply_and_read_back(cluster: Cluster, obj: dict[str, Any]) -> dict[str, Any]:
    applied = cluster.apply(obj, "--server-side")
    assert applied.returncode == 0, applied.stderr
    meta = obj["metadata"]
    stored = cluster.get(obj["kind"].lower(), meta["name"], meta["namespace"])
    assert stored is not None
    return stored


def test_the_objects_fit_the_real_crds_without_a_field_pruned(
    cluster: Cluster, llmd: tuple[render.Owner, models.LLMDeploymentSpec]
) -> None:
    owner, spec = llmd
    objects = [*chart_objects(cluster), render.render_pod_monitor(owner, spec)]
    assert sorted(o["kind"] for o in objects) == [
        "PodMonitor", "PodMonitor", "PodMonitor", "PrometheusRule",
    ]  # fmt: skip
    for obj in objects:
        stored = apply_and_read_back(cluster, obj)
        assert stored["spec"] == obj["spec"], obj["metadata"]["name"]


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


def kept(job: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the job's keep and drop relabelings keep a target with these labels (the
    others rewrite labels, not which targets stay; none of the operator's filters reads them)."""
    for rule in job.get("relabel_configs", []):
        action = rule.get("action", "replace")
        if action not in {"keep", "drop"}:
            continue
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["source_labels"])
        matched = re.fullmatch(rule.get("regex", "(.*)"), value) is not None
        if matched != (action == "keep"):
            return False
    return True


def pod_of(deployment: dict[str, Any], namespace: str) -> dict[str, Any]:
    template = deployment["spec"]["template"]
    return {"metadata": {**template["metadata"], "namespace": namespace}, "spec": template["spec"]}


def test_the_prometheus_operator_scrapes_the_engines_port_and_path(
    cluster: Cluster, llmd: tuple[render.Owner, models.LLMDeploymentSpec], tmp_path: Path
) -> None:
    owner, spec = llmd
    monitors = [o for o in chart_objects(cluster) if o["kind"] == "PodMonitor"]
    monitors.append(render.render_pod_monitor(owner, spec))
    for obj in monitors:
        apply_and_read_back(cluster, obj)
    with PrometheusOperator(cluster, tmp_path) as operator:
        assert cluster.apply(PROMETHEUS).returncode == 0
        config = operator.configuration(MONITORING, "k8s")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    serving = pod_of(render.render_deployment(owner, spec, annotate_for_scraping=False), APP)
    target = meta_labels(serving, render.PORT_NAME)
    for name in (f"podMonitor/{APP}/chat/0", f"podMonitor/{CHART_NAMESPACE}/slotune-vllm/0"):
        job = jobs[name]
        assert job["metrics_path"] == "/metrics", name
        assert job.get("scheme", "http") == "http", name
        assert kept(job, target), f"{name} does not keep the serving pod's target"
        assert not kept(job, {**target, "__meta_kubernetes_pod_container_port_name": "grpc"})
        # Serving pods only: a trial engine's pod is not a user-facing replica.
        trial_pod = render.render_trial_pod(owner, spec, {}, study=1, trial=2)
        trial = meta_labels({**trial_pod, "metadata": {**trial_pod["metadata"], "namespace": APP}},
                            render.PORT_NAME)  # fmt: skip
        assert not kept(job, trial), f"{name} keeps a trial pod's target"


def test_the_prometheus_operator_loads_the_alert_rules(cluster: Cluster, tmp_path: Path) -> None:
    (rule,) = [o for o in chart_objects(cluster) if o["kind"] == "PrometheusRule"]
    apply_and_read_back(cluster, rule)
    with PrometheusOperator(cluster, tmp_path) as operator:
        assert cluster.apply(PROMETHEUS).returncode == 0
        files = operator.rule_files(MONITORING, "k8s")
    loaded = {
        r["alert"] for f in files.values() for g in f["groups"] for r in g["rules"] if "alert" in r
    }
    sent = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert sent
    assert sent <= loaded, sorted(sent - loaded)
