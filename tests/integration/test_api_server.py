"""The generated CRD on the real API server: accepted, structural, and enforcing its rules."""

from __future__ import annotations

from typing import Any

import pytest

from support.cluster import ROOT, Cluster, llmd

pytestmark = pytest.mark.integration


def test_crd_is_established_with_status_subresource_and_columns(cluster: Cluster) -> None:
    crd = cluster.get("crd", "llmdeployments.slotune.dev", "default")
    assert crd is not None
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    # A non-structural schema would show NonStructuralSchema=True.
    assert "NonStructuralSchema" not in conditions
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert cluster.kubectl("get", "llmd", "-A").returncode == 0


@pytest.mark.parametrize("sample", sorted((ROOT / "samples").glob("*.yaml")), ids=lambda p: p.name)
def test_samples_are_accepted_by_the_server(cluster: Cluster, sample: Any) -> None:
    result = cluster.kubectl("apply", "--dry-run=server", "-f", str(sample), check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        # CEL rules (x-kubernetes-validations)
        (
            {"engine": {"args": {"maxNumBatchedTokens": 64, "maxNumSeqs": 128}}},
            "maxNumBatchedTokens must be at least maxNumSeqs",
        ),
        (
            {"model": {"name": "m", "source": {"huggingFace": {}, "pvc": {"claimName": "c"}}}},
            "set exactly one of model.source.huggingFace, model.source.pvc or",
        ),
        ({"slo": None, "tuning": {"enabled": True}}, "tuning.enabled needs an slo to tune for"),
        ({"slo": {"window": "5m"}}, "give at least one SLO target"),
        (
            {"tuning": {"searchSpace": {"maxNumBatchedTokens": {"min": 8192, "max": 512}}}},
            "min must not exceed max",
        ),
        (
            {"tuning": {"workload": {"source": "Synthetic", "requestRate": 4}}},
            "a Synthetic workload needs promptTokens, outputTokens",
        ),
        (
            {"model": {"name": "m", "servedName": "--api-key"}},
            "model.servedName must not start with '-' (vLLM would read it as a flag)",
        ),
        ({"model": {"name": "m\u0001"}}, "model.name must not start with '-'"),
        # OpenAPI schema
        (
            {"engine": {"args": {"gpuMemoryUtilization": 1.5}}},
            "spec.engine.args.gpuMemoryUtilization: Invalid value: 1.5",
        ),
        ({"engine": {"args": {"kvCacheDtype": "int4"}}}, 'Unsupported value: "int4"'),
        ({"replicas": -1}, "spec.replicas: Invalid value: -1"),
        (
            {"engine": {"chunkedPrefillSize": 4096}},
            'unknown field "spec.engine.chunkedPrefillSize"',
        ),
    ],
)
def test_invalid_specs_are_rejected_by_the_server(
    cluster: Cluster, spec: dict[str, Any], message: str
) -> None:
    obj = llmd("bad", "default")
    for key, value in spec.items():
        if value is None:
            obj["spec"].pop(key, None)
        elif key == "engine":  # keep the image, override inside
            obj["spec"][key] = {**obj["spec"][key], **value}
        else:
            obj["spec"][key] = value
    result = cluster.apply(obj, "--dry-run=server")
    assert result.returncode != 0, f"the server accepted {spec}"
    assert message in result.stderr


@pytest.mark.parametrize("name", ["llama-3.1-8b", "a" * 64])
def test_a_name_its_service_cannot_take_is_rejected_by_the_server(
    cluster: Cluster, name: str
) -> None:
    result = cluster.apply(llmd(name, "default"), "--dry-run=server")
    assert result.returncode != 0, f"the server accepted the name {name!r}"
    assert "metadata.name must be a DNS-1035 label" in result.stderr
    accepted = cluster.apply(llmd("llama-3-1-8b", "default"), "--dry-run=server")
    assert accepted.returncode == 0, accepted.stderr
