"""Deleting and uninstalling complete, whether or not the operator runs: no LLMDeployment
carries a finalizer, and its children go through the garbage collector by their owner
references. (Last of the integration modules, by name: it deletes the CRD.)"""

from __future__ import annotations

import pytest

from support.cluster import Cluster, OperatorProcess, llmd, wait_for

pytestmark = pytest.mark.integration

KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
CRD = "crd/llmdeployments.slotune.dev"


def children(cluster: Cluster, namespace: str) -> list[str]:
    return cluster.kubectl(
        "get", "deployment,replicaset,service,pod", "-n", namespace, "-o", "name"
    ).stdout.split()


def deployed(cluster: Cluster, namespace: str, name: str) -> None:
    assert cluster.apply(llmd(name, namespace)).returncode == 0
    wait_for("the Deployment", lambda: cluster.get("deployment", name, namespace))
    wait_for("the Service", lambda: cluster.get("service", name, namespace))
    wait_for(
        "a status (the operator has handled it)",
        lambda: (cluster.get("llmd", name, namespace) or {}).get("status", {}).get("phase"),
    )


def test_no_finalizer_and_one_left_by_an_earlier_version_is_removed(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    deployed(cluster, namespace, "plain")
    assert not cluster.get("llmd", "plain", namespace)["metadata"].get("finalizers")  # type: ignore[index]
    old = llmd("old", namespace)
    old["metadata"]["finalizers"] = [KOPF_FINALIZER]  # as the Kopf timer of 0.1 left it
    assert cluster.apply(old).returncode == 0
    wait_for(
        "Kopf's finalizer to be taken off",
        lambda: not (cluster.get("llmd", "old", namespace) or {})["metadata"].get("finalizers"),
    )


def test_delete_completes_while_the_operator_is_down(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    deployed(cluster, namespace, "orphan")
    operator.stop()
    try:
        result = cluster.kubectl(
            "delete", "llmd", "orphan", "-n", namespace, "--wait=true", "--timeout=30s",
            check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        wait_for("every child to be collected", lambda: not children(cluster, namespace), 60)
        deleted = cluster.kubectl("delete", "namespace", namespace, "--timeout=60s", check=False)
        assert deleted.returncode == 0, deleted.stderr
    finally:
        operator.start()


def test_deleting_the_crd_with_objects_present_completes_and_collects_the_children(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """What `kubectl delete -f manifests/slotune.yaml` does first; the operator keeps running
    and serves again once the CRD is back."""
    deployed(cluster, namespace, "one")
    deployed(cluster, namespace, "two")
    try:
        result = cluster.kubectl("delete", CRD, "--wait=true", "--timeout=60s", check=False)
        assert result.returncode == 0, result.stderr
        wait_for("every child to be collected", lambda: not children(cluster, namespace), 90)
    finally:
        cluster.install_crd()
    assert not operator.dead(), operator.log()[-3000:]
    deployed(cluster, namespace, "again")
