"""Shared caches and models from an OCI image on the real API server: the serving Deployment and
a trial pod as slotune renders them, with an image volume for the model or a claim for the
caches, pass the server's validation of the pod template and are kept as sent (a server without
image volumes would drop the volume and its mount without a word); the CRD refuses two model
sources."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slotune import models, render
from support.cluster import Cluster, llmd

pytestmark = pytest.mark.integration

MODEL_IMAGE = "registry.example/models/qwen2.5-0.5b:v1"
SPECS: dict[str, dict[str, Any]] = {
    "image": {"model": {"name": "qwen", "source": {"image": {"reference": MODEL_IMAGE}}}},
    "cache": {
        "model": {"name": "qwen", "source": {"pvc": {"claimName": "models", "path": "qwen"}}},
        "cache": {"pvc": {"claimName": "llm-cache"}},
    },
}


def rendered(kind: str, spec: models.LLMDeploymentSpec, namespace: str) -> dict[str, Any]:
    """The serving Deployment or a trial pod, owned by an LLMDeployment that need not exist: a
    dry run stores nothing for the garbage collector to remove."""
    owner = render.Owner(
        name="chat", namespace=namespace, uid="8f1c2d3e-0000-4000-8000-000000000001"
    )
    if kind == "Deployment":
        return render.render_deployment(owner, spec, annotate_for_scraping=False)
    return render.render_trial_pod(owner, spec, {"max_num_seqs": 64}, study=1, trial=1)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]
    return spec["template"]["spec"] if obj["kind"] == "Deployment" else spec


def dry_run(cluster: Cluster, obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the server would store it: validated, defaulted, nothing written."""
    result = cluster.apply(obj, "--server-side", "--dry-run=server", "-o", "json")
    assert result.returncode == 0, result.stderr
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


@pytest.mark.parametrize("kind", ["Deployment", "Pod"])
def test_an_image_volume_holds_the_model_read_only(
    cluster: Cluster, namespace: str, kind: str
) -> None:
    spec = models.LLMDeploymentSpec.model_validate(SPECS["image"])
    stored = pod_spec(dry_run(cluster, rendered(kind, spec, namespace)))
    volumes = {v["name"]: v for v in stored["volumes"]}
    # Unset in the spec, the pull policy is the server's default for a tag that is not latest.
    assert volumes["model"]["image"] == {"reference": MODEL_IMAGE, "pullPolicy": "IfNotPresent"}
    engine = stored["containers"][0]
    mounts = {m["name"]: m for m in engine["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert engine["args"][engine["args"].index("--model") + 1] == "/models"


@pytest.mark.parametrize("kind", ["Deployment", "Pod"])
def test_a_cache_claim_is_mounted_beside_a_model_claim(
    cluster: Cluster, namespace: str, kind: str
) -> None:
    spec = models.LLMDeploymentSpec.model_validate(SPECS["cache"])
    sent = rendered(kind, spec, namespace)
    stored = pod_spec(dry_run(cluster, sent))
    volumes = {v["name"]: v for v in stored["volumes"]}
    assert volumes["cache"]["persistentVolumeClaim"] == {"claimName": "llm-cache"}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    engine = stored["containers"][0]
    # Every mount as rendered; a bare pod gets the ServiceAccount token's beside them.
    mounts = [m for m in engine["volumeMounts"] if not m["name"].startswith("kube-api-access-")]
    assert mounts == pod_spec(sent)["containers"][0]["volumeMounts"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["VLLM_CACHE_ROOT"] == "/root/.cache/vllm"
    assert env["HF_HOME"] == "/root/.cache/huggingface"


@pytest.mark.parametrize("spec", SPECS.values(), ids=list(SPECS))
def test_the_llmdeployment_is_accepted(
    cluster: Cluster, namespace: str, spec: dict[str, Any]
) -> None:
    result = cluster.apply(llmd("chat", namespace, **spec), "--dry-run=server")
    assert result.returncode == 0, result.stderr


def test_two_model_sources_are_refused_naming_the_image(cluster: Cluster, namespace: str) -> None:
    source = {"image": {"reference": MODEL_IMAGE}, "pvc": {"claimName": "models"}}
    result = cluster.apply(
        llmd("chat", namespace, model={"name": "qwen", "source": source}), "--dry-run=server"
    )
    assert result.returncode != 0, "the server accepted two model sources"
    assert (
        "set exactly one of model.source.huggingFace, model.source.pvc, model.source.image or "
        "model.source.randomWeights" in result.stderr
    )
