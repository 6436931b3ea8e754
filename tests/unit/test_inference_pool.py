"""The optional InferencePool: which pods it selects, and its life through the reconcile
against the in-memory API. That the real CRD stores it as rendered is
tests/integration/test_platform_crds.py's to show."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from slotune import render
from slotune.kube import Ref
from slotune.measure.capacity import MeasureRequest
from slotune.models import LLMDeploymentStatus
from slotune.reconcile import reconcile
from support.memkube import SERVED, MemoryApi
from support.specs import llm_spec, tuning

OWNER = render.Owner(name="chat", namespace="llm", uid="u-1")
NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
POOL_API = ("inference.networking.k8s.io/v1", "inferencepools")
POOL = Ref("inference.networking.k8s.io/v1", "InferencePool", "llm", "chat")
EPP = {"name": "chat-epp", "port": 9002}


def selects(pool: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted: dict[str, str] = pool["spec"]["selector"]["matchLabels"]
    return wanted.items() <= labels.items()


def test_rendered_only_when_switched_on() -> None:
    def kinds(**fields: Any) -> list[str]:
        children = render.render_children(OWNER, llm_spec(**fields), pod_monitor_crd_present=False)
        return [child["kind"] for child in children]

    assert kinds() == ["Deployment", "Service"]
    assert kinds(inferencePool={"enabled": False, "endpointPickerRef": EPP}) == kinds()
    assert kinds(inferencePool={"enabled": True}) == ["Deployment", "Service", "InferencePool"]


def test_the_pool_selects_the_serving_pods_and_never_a_trial_or_load_pod() -> None:
    spec = llm_spec(inferencePool={"enabled": True}, tuning=tuning())
    pool = render.render_inference_pool(OWNER, spec)
    serving = render.render_deployment(OWNER, spec, annotate_for_scraping=False)
    assert selects(pool, serving["spec"]["template"]["metadata"]["labels"])
    assert pool["spec"]["targetPorts"] == [
        {
            "number": serving["spec"]["template"]["spec"]["containers"][0]["ports"][0][
                "containerPort"
            ]
        }
    ]
    trial = render.render_trial_pod(OWNER, spec, {"maxNumSeqs": 32}, study=1, trial=0)
    assert not selects(pool, trial["metadata"]["labels"])
    load = render.render_load_job(
        OWNER,
        spec,
        image="slotune/operator:1",
        url="http://10.0.0.9:8000",
        workload=spec.tuning.workload,
        request=MeasureRequest(seed=1, target_rate=2.0),
        study=1,
        trial=0,
    )
    assert not selects(pool, load["spec"]["template"]["metadata"]["labels"])
    # Promoted: the Deployment rolls to pods of another config hash, which the pool still holds.
    promoted = render.with_params(spec, {"maxNumSeqs": 32})
    rolled = render.render_deployment(OWNER, promoted, annotate_for_scraping=False)
    assert render.config_hash(OWNER, promoted) != render.config_hash(OWNER, spec)
    assert render.render_inference_pool(OWNER, promoted)["spec"] == pool["spec"]
    assert selects(pool, rolled["spec"]["template"]["metadata"]["labels"])


def test_the_pool_is_owned_and_names_the_users_endpoint_picker() -> None:
    spec = llm_spec(inferencePool={"enabled": True, "endpointPickerRef": EPP})
    pool = render.render_inference_pool(OWNER, spec)
    assert pool["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "chat-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    without = render.render_inference_pool(OWNER, llm_spec(inferencePool={"enabled": True}))
    assert "endpointPickerRef" not in without["spec"]


class CountingApi(MemoryApi):
    """Counts the reads of the pool's name."""

    pool_reads = 0

    def get(self, ref: Ref) -> dict[str, Any] | None:
        if ref == POOL:
            self.pool_reads += 1
        return super().get(ref)


def cluster(*, with_crd: bool = True) -> CountingApi:
    return CountingApi(served=SERVED | {POOL_API} if with_crd else SERVED)


def passes(api: MemoryApi, pool: dict[str, Any] | None) -> LLMDeploymentStatus:
    """Stores the LLMDeployment with this spec.inferencePool and reconciles it; returns its
    status."""
    ref = Ref("slotune.dev/v1alpha1", "LLMDeployment", "llm", "chat")
    stored = api.get(ref) or {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "llm", "uid": OWNER.uid, "generation": 0},
    }
    stored["spec"] = {"model": {"name": "tiny"}, **({"inferencePool": pool} if pool else {})}
    stored["metadata"]["generation"] += 1
    api.objects[MemoryApi._key(ref)] = copy.deepcopy(stored)
    reconcile(stored, api, NOW)
    return LLMDeploymentStatus.model_validate((api.get(ref) or {})["status"])


def test_switched_on_the_pool_is_applied_and_switched_off_ours_is_deleted() -> None:
    api = cluster()
    passes(api, {"enabled": True, "endpointPickerRef": EPP})
    pool = api.get(POOL)
    assert pool is not None
    assert pool["spec"]["endpointPickerRef"]["name"] == "chat-epp"
    passes(api, {"enabled": False, "endpointPickerRef": EPP})
    assert api.get(POOL) is None


def test_a_spec_that_never_had_a_pool_costs_no_read_of_one() -> None:
    api = cluster()
    for _ in range(2):
        passes(api, None)
    assert api.pool_reads == 0


@pytest.mark.parametrize(
    "references",
    [[], [{**OWNER.reference(), "uid": "another", "name": "other"}]],
    ids=["no owner", "another owner"],
)
def test_someone_elses_pool_is_never_taken_over_nor_deleted(
    references: list[dict[str, Any]],
) -> None:
    api = cluster()
    passes(api, {"enabled": True})
    theirs = {
        "apiVersion": POOL.api_version,
        "kind": POOL.kind,
        "metadata": {"name": "chat", "namespace": "llm", "ownerReferences": references},
        "spec": {"selector": {"matchLabels": {"app": "theirs"}}, "targetPorts": [{"number": 80}]},
    }
    api.objects[MemoryApi._key(POOL)] = copy.deepcopy(theirs)  # ours deleted, theirs made

    status = passes(api, {"enabled": True, "endpointPickerRef": EPP})
    ready = status.condition("Ready")
    assert ready is not None
    assert ready.reason == "ChildConflict"
    assert "InferencePool llm/chat already exists" in ready.message
    assert api.get(POOL) == theirs

    passes(api, {"enabled": False})
    assert api.get(POOL) == theirs


def test_switched_on_without_the_crd_says_what_to_install() -> None:
    api = cluster(with_crd=False)
    status = passes(api, {"enabled": True})
    assert status.phase == "Invalid"
    assert status.message is not None
    assert (
        "spec.inferencePool.enabled: true, but the cluster has no InferencePool CRD "
        "(inference.networking.k8s.io/v1); install the Gateway API Inference Extension's CRDs "
        "(v1.0 or later) or set enabled: false"
    ) in status.message
    assert api.get(Ref("apps/v1", "Deployment", "llm", "chat")) is None  # nothing applied


def test_the_readme_shows_the_pool_slotune_renders() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    head = "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
    shown = yaml.safe_load(head + readme.split(head, 1)[1].split("```", 1)[0])
    spec = llm_spec(inferencePool={"enabled": True, "endpointPickerRef": EPP})
    rendered = render.render_inference_pool(render.Owner("chat", "llm", "<its uid>"), spec)
    for pool in (shown, rendered):  # the hash follows the default image
        del pool["metadata"]["labels"][render.LABEL_CONFIG_HASH]
    assert shown == rendered
