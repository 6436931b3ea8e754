"""The upstream control plane from tests/support/controlplane.py really works:
API, Deployment -> ReplicaSet -> Pods, owner-reference GC, and RBAC."""

from __future__ import annotations

import json
import time

import pytest

from support.controlplane import ControlPlane, bin_dir_from_env

pytestmark = pytest.mark.integration

NS = "cp-check"

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": NS},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}]},
        },
    },
}


@pytest.fixture(scope="module")
def cp(tmp_path_factory):
    plane = ControlPlane(bin_dir_from_env(build=True), tmp_path_factory.mktemp("controlplane"))
    plane.start(timeout=180)
    try:
        plane.kubectl_run("create", "namespace", NS)
        yield plane
    finally:
        plane.stop()


def _wait(fn, timeout=90.0, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last={last!r}")


def _items(cp, *args):
    return json.loads(cp.kubectl_run("get", *args, "-n", NS, "-o", "json").stdout)["items"]


def test_apiserver_answers(cp):
    out = cp.kubectl_run("get", "ns", "-o", "name").stdout.split()
    assert "namespace/default" in out
    assert "namespace/kube-system" in out
    assert cp.server.startswith("https://127.0.0.1:")
    version = json.loads(cp.kubectl_run("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")


def test_deployment_creates_replicaset_and_pods_then_gc(cp):
    cp.kubectl_run("apply", "-f", "-", input=json.dumps(DEPLOYMENT))
    dep_uid = json.loads(cp.kubectl_run("get", "deploy", "web", "-n", NS, "-o", "json").stdout)[
        "metadata"
    ]["uid"]

    def rs_of_deployment():
        return [
            rs
            for rs in _items(cp, "replicasets")
            if any(o["uid"] == dep_uid for o in rs["metadata"].get("ownerReferences", []))
        ]

    rss = _wait(rs_of_deployment, what="ReplicaSet owned by the Deployment")
    rs_uid = rss[0]["metadata"]["uid"]

    def pods_of_rs():
        pods = [
            p
            for p in _items(cp, "pods")
            if any(o["uid"] == rs_uid for o in p["metadata"].get("ownerReferences", []))
        ]
        return pods if len(pods) == 2 else None

    pods = _wait(pods_of_rs, what="2 Pods owned by the ReplicaSet")
    for pod in pods:
        # no nodes: scheduled nowhere, stays Pending
        assert pod["status"]["phase"] == "Pending"
        # ServiceAccount admission is active: a projected token volume was injected
        assert pod["spec"]["serviceAccountName"] == "default"
        assert any("projected" in v for v in pod["spec"].get("volumes", []))

    cp.kubectl_run("delete", "deploy", "web", "-n", NS, "--wait=true")
    _wait(lambda: not rs_of_deployment(), what="ReplicaSet garbage-collected")
    _wait(lambda: not _items(cp, "pods"), what="Pods garbage-collected")


def test_rbac_is_enforced_for_service_account_tokens(cp, tmp_path):
    cp.kubectl_run("create", "serviceaccount", "tester", "-n", NS)
    cp.kubectl_run("create", "secret", "generic", "s1", "-n", NS, "--from-literal=k=v")
    token = cp.kubectl_run("create", "token", "tester", "-n", NS).stdout.strip()
    kc = cp.kubeconfig_for_token(token, tmp_path / "tester.kubeconfig")

    who = json.loads(cp.kubectl_run("auth", "whoami", "-o", "json", kubeconfig=kc).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{NS}:tester"

    denied = cp.kubectl_run("get", "secrets", "-n", NS, kubeconfig=kc, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr or "forbidden" in denied.stderr, denied.stderr

    # admin can, and a RoleBinding grants exactly what it says
    assert "s1" in cp.kubectl_run("get", "secrets", "-n", NS, "-o", "name").stdout
    cp.kubectl_run("create", "role", "pod-reader", "-n", NS, "--verb=list", "--resource=pods")
    cp.kubectl_run(
        "create",
        "rolebinding",
        "tester-pods",
        "-n",
        NS,
        "--role=pod-reader",
        f"--serviceaccount={NS}:tester",
    )
    _wait(
        lambda: (
            cp.kubectl_run(
                "auth", "can-i", "list", "pods", "-n", NS, kubeconfig=kc, check=False
            ).stdout.strip()
            == "yes"
        ),
        timeout=30,
        what="RoleBinding to take effect",
    )
    assert (
        cp.kubectl_run(
            "auth", "can-i", "list", "secrets", "-n", NS, kubeconfig=kc, check=False
        ).stdout.strip()
        == "no"
    )


def test_static_admin_token(cp, tmp_path):
    kc = cp.kubeconfig_for_token(cp.admin_token, tmp_path / "admin-token.kubeconfig")
    assert cp.kubectl_run("auth", "can-i", "*", "*", kubeconfig=kc).stdout.strip() == "yes"
