"""What the operator's cached client saves, and what it must not, on the real API server:
an apply skipped after a status-only change (the controller-manager's rollout progress), and
re-sent after any change to what slotune applies (a hand edit of the spec or a label); a
child's status event reconciling its owner from the body last seen, without a request."""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any

import kopf
import pytest

from slotune import edge, handlers, render
from slotune.kube import MANAGED_BY, MANAGED_BY_LABEL, CachedKube, load_api_client
from support.cluster import Cluster, llmd, wait_for

pytestmark = pytest.mark.integration


def deployment(namespace: str, name: str) -> dict[str, Any]:
    labels = {MANAGED_BY_LABEL: MANAGED_BY, "app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "example.invalid/c:1"}]},
            },
        },
    }


def counted(cluster: Cluster) -> tuple[CachedKube, Counter[str]]:
    requests: Counter[str] = Counter()

    def count(verb: str) -> None:
        requests[verb] += 1

    kube = CachedKube(load_api_client(str(cluster.plane.admin_kubeconfig)), on_request=count)
    return kube, requests


def test_an_apply_is_skipped_after_a_status_change_and_resent_after_an_edit(
    cluster: Cluster, namespace: str
) -> None:
    kube, requests = counted(cluster)
    wanted = deployment(namespace, "cached")
    kube.apply(wanted)
    assert requests == {"patch": 1}

    # The controller-manager writes the Deployment's status (a new resourceVersion); the
    # watch delivers it. What slotune applied is unchanged: nothing to send.
    def rolled() -> dict[str, Any] | None:
        live = cluster.get("deployment", "cached", namespace)
        return live if live and live.get("status", {}).get("observedGeneration") else None

    kube.observed({"apiVersion": "apps/v1", "kind": "Deployment", **wait_for("status", rolled)})
    kube.apply(wanted)
    assert requests == {"patch": 1}
    assert kube.skipped_applies == 1

    # A hand edit of the spec, then of a label: each is taken back by the next apply.
    for edit in (("scale", "--replicas=3"), ("label", "app=other", "--overwrite")):
        cluster.kubectl(edit[0], "deployment", "cached", "-n", namespace, *edit[1:])
        live = cluster.get("deployment", "cached", namespace)
        assert live is not None
        kube.observed({"apiVersion": "apps/v1", "kind": "Deployment", **live})
        sent = requests["patch"]
        kube.apply(wanted)
        assert requests["patch"] == sent + 1
        restored = cluster.get("deployment", "cached", namespace)
        assert restored is not None
        assert restored["spec"]["replicas"] == 1
        assert restored["metadata"]["labels"]["app"] == "cached"


def pods_of(cluster: Cluster, namespace: str, owner: str) -> list[dict[str, Any]]:
    listed = cluster.kubectl(
        "get", "pods", "-n", namespace, "-l", f"{render.LABEL_OWNER}={owner}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return items


def test_a_childs_status_event_costs_no_request(cluster: Cluster, namespace: str) -> None:
    """The handlers run in this process, with a client of their own, on what the watches
    would deliver: the Deployment with the status the controller-manager wrote, its pod, then
    the owner's deletion and the Deployment's. (The suite's shared operator, when it runs, acts on
    the object too, with the same field manager: its writes of the same values change
    nothing.)"""
    assert cluster.apply(llmd("owner", namespace)).returncode == 0
    kube, requests = counted(cluster)
    services = edge.build(edge.Launch(), kube=kube)
    memo = kopf.Memo(services=services)
    logger = logging.getLogger("test")
    ref = {"metadata": {"namespace": namespace, "name": "owner"}}
    services.reconciler.run(ref, logger)
    assert requests["get"] >= 1  # a first look reads the object
    assert requests["patch"] >= 2  # and applies its children

    def rolled() -> dict[str, Any] | None:
        live = cluster.get("deployment", "owner", namespace)
        return live if live and live.get("status", {}).get("observedGeneration") else None

    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", **wait_for("status", rolled)}
    kube.observed(deployment)
    services.reconciler.run(ref, logger)  # the owner's status as the Deployment's now says
    before = dict(requests)
    event = {"type": "MODIFIED", "object": deployment}
    handlers.on_child_event(event, kopf.Body(deployment), memo, logger)
    assert dict(requests) == before  # owner, children and status all unchanged: no request
    pods = wait_for("its pod", lambda: pods_of(cluster, namespace, "owner"))
    pod = {"apiVersion": "v1", "kind": "Pod", **pods[0]}
    handlers.on_child_event({"type": "MODIFIED", "object": pod}, kopf.Body(pod), memo, logger)
    assert dict(requests) == before  # a pod (its ReplicaSet's) too

    # Deleted: the garbage collector's deletes of its children cost no request either.
    owner = cluster.get("llmd", "owner", namespace)
    assert owner is not None
    cluster.kubectl("delete", "llmd", "owner", "-n", namespace)
    handlers.on_llm_deployment_event({"type": "DELETED", "object": owner}, memo)
    event = {"type": "DELETED", "object": deployment}
    handlers.on_child_event(event, kopf.Body(deployment), memo, logger)
    assert dict(requests) == before
