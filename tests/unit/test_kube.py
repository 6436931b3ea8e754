"""Where a pod finds the API server."""

from __future__ import annotations

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
