"""The API models, the generated CRD and the sample resources agree with each other."""

import itertools
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from slotune import cli, crdgen, models

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "samples").glob("*.yaml"))


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / crdgen.CRD_FILE).read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_validate_against_models_and_schema(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        models.LLMDeployment.model_validate(doc)
        # The CRD schema is OpenAPI v3 (draft-4 style exclusiveMinimum); Draft4 checks it.
        jsonschema.Draft4Validator(crd_schema()).validate(doc)


def test_samples_pass_the_cli_validator(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", *map(str, SAMPLES)]) == 0
    assert "valid" in capsys.readouterr().out


def test_schema_rejects_what_the_models_reject() -> None:
    bad = {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "x"},
        "spec": {"model": {"name": "m"}, "engine": {"args": {"gpuMemoryUtilization": 1.5}}},
    }
    with pytest.raises(ValidationError):
        models.LLMDeployment.model_validate(bad)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(crd_schema()).validate(bad)


def test_schema_is_structural() -> None:
    """Every node has a type (or preserves unknown fields); no refs or unions remain."""

    def walk(node: dict[str, Any], path: str) -> None:
        assert "$ref" not in node, path
        assert "anyOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}")

    walk(crd_schema(), "")


def test_crds_check_fails_when_the_file_is_edited_by_hand(tmp_path: Path) -> None:
    shutil.copy(ROOT / "crds" / crdgen.CRD_FILE, tmp_path / crdgen.CRD_FILE)
    assert cli.main(["crds", "check", "--dir", str(tmp_path)]) == 0
    path = tmp_path / crdgen.CRD_FILE
    path.write_text(path.read_text().replace("shortNames:\n    - llmd", "shortNames:\n    - llm"))
    assert cli.main(["crds", "check", "--dir", str(tmp_path)]) == 1


def test_committed_crd_matches_the_models() -> None:
    assert crdgen.check(ROOT / "crds") == []


def test_printer_columns_cover_what_on_call_needs() -> None:
    crd = crdgen.crd()
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    glance = [c["name"] for c in columns if not c.get("priority")]
    assert glance == ["Phase", "Ready", "TTFT-P95", "SLO-Met", "Trials", "Capacity", "Age"]
    # The scaling figures come with `-o wide`.
    assert [c["name"] for c in columns if c.get("priority") == 1] == ["Needed", "Per-Replica"]
    # The scale subresource: `kubectl scale`, HPA and KEDA reach spec.replicas through it, and
    # an HPA finds the pods by the selector in status.
    assert crd["spec"]["versions"][0]["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    assert crd["spec"]["names"]["shortNames"] == ["llmd"]
    # The scale subresource reads spec.replicas: the server defaults it for objects without.
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["replicas"]["default"] == 1


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"model": {"name": "m", "source": {}}}, "exactly one of"),
        (
            {
                "model": {
                    "name": "m",
                    "source": {"image": {"reference": "models/m:1"}, "pvc": {"claimName": "c"}},
                }
            },
            r"model\.source\.pvc, model\.source\.image or",
        ),
        (
            {
                "model": {"name": "m"},
                "engine": {"args": {"maxNumBatchedTokens": 8, "maxNumSeqs": 16}},
            },
            "at least maxNumSeqs",
        ),
        ({"model": {"name": "m"}, "tuning": {"enabled": True}}, "needs an slo"),
        ({"model": {"name": "m"}, "slo": {"window": "5m"}}, "at least one SLO target"),
        (
            {
                "model": {"name": "m"},
                "tuning": {"searchSpace": {"blockSize": {"min": 64, "max": 16}}},
            },
            "min must not exceed max",
        ),
        ({"model": {"name": "m"}, "tuning": {"workload": {"source": "Synthetic"}}}, "Synthetic"),
        ({"model": {"name": "m"}, "engine": {"imag": "x"}}, "Extra inputs are not permitted"),
        ({"model": {"name": "m", "servedName": "--api-key"}}, "servedName must not start"),
        ({"model": {"name": "-m"}}, "model.name must not start with '-'"),
        ({"model": {"name": "m\u0007x"}}, "nor hold control characters"),
        (
            {"model": {"name": "m"}, "tuning": {"searchSpace": {"kvCacheDtype": ["auto", "fp8"]}}},
            "names lossy settings",
        ),
        (
            {"model": {"name": "m"}, "tuning": {"searchSpace": {"quantization": ["fp8"]}}},
            "set tuning.quality.allowLossy: true",
        ),
        (
            {
                "model": {"name": "m"},
                "engine": {
                    "args": {
                        "speculative": {
                            "method": "ngram",
                            "numSpeculativeTokens": 4,
                            "draftModel": "m-small",
                        }
                    }
                },
            },
            "draftModel goes with a method that has a model",
        ),
        (
            {
                "model": {"name": "m"},
                "engine": {
                    "args": {"speculative": {"method": "draft_model", "numSpeculativeTokens": 4}}
                },
            },
            "method draft_model needs draftModel",
        ),
        (
            {
                "model": {"name": "m"},
                "tuning": {"strategy": "InPlace", "quality": {"allowLossy": True}},
            },
            "quality.allowLossy needs strategy Canary",
        ),
    ],
)
def test_cross_field_rules_in_python(spec: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        models.LLMDeploymentSpec.model_validate(spec)


def test_every_python_cross_field_rule_has_a_cel_twin() -> None:
    rules = yaml.safe_dump(crdgen.crd())
    for fragment in (
        "exactly one of model.source",
        "at least maxNumSeqs",
        "needs an slo",
        "at least one SLO target",
        "min must not exceed max",
        "a Synthetic workload needs",
        "model.name must not start with '-'",
        "model.servedName must not start with '-'",
        "searchSpace names lossy settings",
        "draftModel goes with a method that has a model",
        "method draft_model needs draftModel",
        "quality.allowLossy needs strategy Canary",
    ):
        assert fragment in rules


# One well-formed value of each model source.
SOURCES: dict[str, dict[str, Any]] = {
    "huggingFace": {},
    "pvc": {"claimName": "models"},
    "image": {"reference": "registry.example/models/m:1"},
    "randomWeights": {},
}


def test_the_one_source_rule_counts_and_names_every_model_source() -> None:
    """The server refuses two sources as the models do: the CRD's exactly-one rule counts every
    source the schema has, and its message names each (the real server evaluates it in
    tests/integration/test_api_server.py and test_caches.py)."""
    source = crd_schema()["properties"]["spec"]["properties"]["model"]["properties"]["source"]
    (rule,) = source["x-kubernetes-validations"]
    assert set(re.findall(r"has\(self\.(\w+)\)", rule["rule"])) == set(source["properties"])
    assert rule["rule"].endswith(".exists_one(x, x)")
    for name in source["properties"]:
        assert f"model.source.{name}" in rule["message"]
    assert set(SOURCES) == set(source["properties"])


@pytest.mark.parametrize("pair", list(itertools.combinations(SOURCES, 2)), ids="+".join)
def test_two_model_sources_are_refused_one_is_enough(pair: tuple[str, str]) -> None:
    for name in pair:
        models.ModelSource.model_validate({name: SOURCES[name]})
    with pytest.raises(ValidationError, match=r"set exactly one of model\.source"):
        models.ModelSource.model_validate({name: SOURCES[name] for name in pair})


@pytest.mark.parametrize(
    "name", ["llama-3.1-8b", "Llama", "8b-llama", "x" * 64, "llama-", "llama_8b"]
)
def test_a_name_the_children_cannot_take_is_refused(name: str) -> None:
    body = {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": "m"}},
    }
    with pytest.raises(ValidationError, match=r"metadata\.name must be a DNS-1035 label"):
        models.LLMDeployment.model_validate(body)
    assert models.LLMDeployment.model_validate({**body, "metadata": {"name": "llama-3-1-8b"}})
    root = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert root["x-kubernetes-validations"] == [models.OBJECT_NAME_RULE]


def test_the_cli_validator_warns_of_an_image_without_a_flag_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(SAMPLES[0].read_text())
    doc["spec"]["engine"]["image"] = "vllm/vllm-openai:latest"
    path = tmp_path / "latest.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", str(path)]) == 0  # a warning, not an error
    err = capsys.readouterr().err
    assert "warning: the flags were checked against vLLM 0.32.0's parser" in err
