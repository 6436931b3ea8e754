"""Where a pod finds the API server; when a cached child still holds what was applied."""

from __future__ import annotations

from typing import Any

from slotune import kube
from slotune.kube import in_cluster_server


def test_a_pod_dials_the_address_its_kubelet_gives() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(env) == "https://10.96.0.1:443"


def test_an_ipv6_service_address_is_bracketed() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_server(env) == "https://[fd00::1]:6443"


def test_without_the_kubelet_variables_the_service_dns_name() -> None:
    assert in_cluster_server({}) == "https://kubernetes.default.svc"
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == (
        "https://kubernetes.default.svc"
    )


APPLIED = {
    "metadata": {"name": "chat", "labels": {"app": "chat"}, "annotations": {}},
    "spec": {
        "replicas": 1,
        "template": {"spec": {"containers": [{"name": "vllm", "args": ["--port", "8000"]}]}},
    },
}


def live() -> dict[str, Any]:
    """APPLIED as the server keeps it: defaults filled in, a controller's annotation, status."""
    return {
        "metadata": {
            "name": "chat",
            "labels": {"app": "chat"},
            "annotations": {"deployment.kubernetes.io/revision": "2"},
            "resourceVersion": "41",
        },
        "spec": {
            "replicas": 1,
            "strategy": {"type": "RollingUpdate"},
            "template": {
                "spec": {
                    "containers": [
                        {"name": "vllm", "args": ["--port", "8000"], "imagePullPolicy": "Always"}
                    ],
                    "dnsPolicy": "ClusterFirst",
                }
            },
        },
        "status": {"observedGeneration": 2, "replicas": 1},
    }


def test_the_server_defaults_a_controller_annotation_and_status_still_hold() -> None:
    assert kube.holds(live(), APPLIED)


def test_a_changed_value_a_removed_label_or_another_list_does_not_hold() -> None:
    scaled = live()
    scaled["spec"]["replicas"] = 3
    assert not kube.holds(scaled, APPLIED)
    unlabelled = live()
    unlabelled["metadata"]["labels"] = {}
    assert not kube.holds(unlabelled, APPLIED)
    extra = live()
    containers = extra["spec"]["template"]["spec"]["containers"]
    containers.append({"name": "sidecar"})
    assert not kube.holds(extra, APPLIED)
    other_args = live()
    other_args["spec"]["template"]["spec"]["containers"][0]["args"] = ["--port", "9000"]
    assert not kube.holds(other_args, APPLIED)


def test_empty_or_null_wanted_values_match_their_absence_only() -> None:
    assert kube.holds({"spec": {}}, {"spec": {"tolerations": [], "nodeSelector": {}}})
    assert kube.holds({}, {"metadata": {"annotations": None}})
    assert not kube.holds({"spec": {"nodeSelector": {"a": "b"}}}, {"spec": {"nodeSelector": None}})
