"""slotune's objects of the platform projects' kinds against those projects' own CRDs, fetched
from their pinned Go modules (tests/support/platform_crds.py): the API server takes each as
slotune renders it and prunes nothing, and the operator, under the chart's RBAC, applies and
removes them.

The control plane is the module's own, so that the session's cluster stays one without these
CRDs, as most clusters are.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from slotune import models, render
from support.cluster import Cluster, OperatorProcess, llmd, wait_for
from support.controlplane import ControlPlane, bin_dir_from_env
from support.platform_crds import install_platform_crds

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
