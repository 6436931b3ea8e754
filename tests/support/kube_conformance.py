"""One suite for every `KubeApi`: the real API server (through `slotune.kube.Kube`) and the
tests' in-memory API (`support.memkube.MemoryApi`) must behave alike in what the operator
relies on. A subclass provides the `api` and `ns` fixtures; the suite is the same."""

from __future__ import annotations

from typing import Any

import pytest

from slotune.kube import KubeApi, KubeError, Ref


def llmd(ns: str, name: str, block_size: int = 16) -> dict[str, Any]:
    return {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"model": {"name": "m"}, "engine": {"args": {"blockSize": block_size}}},
    }


def config_map(ns: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "data": {"k": "v"},
    }


def ref(ns: str, name: str) -> Ref:
    return Ref("slotune.dev/v1alpha1", "LLMDeployment", ns, name)


class KubeApiConformance:
    """What a reconcile and a study step rely on."""

    def test_a_missing_object_reads_as_none(self, api: KubeApi, ns: str) -> None:
        assert api.get(ref(ns, "absent")) is None

    def test_apply_creates_and_the_generation_moves_only_with_the_spec(
        self, api: KubeApi, ns: str
    ) -> None:
        created = api.apply(llmd(ns, "gen"))
        meta = created["metadata"]
        assert meta["generation"] == 1
        assert meta["uid"]
        again = api.apply(llmd(ns, "gen"))
        assert again["metadata"]["generation"] == 1
        assert again["metadata"]["uid"] == meta["uid"]
        changed = api.apply(llmd(ns, "gen", block_size=32))
        assert changed["metadata"]["generation"] == 2
        assert changed["metadata"]["resourceVersion"] != meta["resourceVersion"]
        assert api.get(ref(ns, "gen")) == changed

    def test_status_goes_through_its_subresource_only(self, api: KubeApi, ns: str) -> None:
        api.apply(llmd(ns, "st"))
        written = api.apply_status(ns, "st", {"phase": "Pending", "observedGeneration": 1})
        assert written["status"] == {"phase": "Pending", "observedGeneration": 1}
        assert written["metadata"]["generation"] == 1
        # The spec as written, with the defaults the CRD declares filled in by the server.
        assert written["spec"] == {**llmd(ns, "st")["spec"], "replicas": 1}
        body = {**llmd(ns, "st", block_size=32), "status": {"phase": "Ready"}}
        applied = api.apply(body)  # a main-resource write leaves status alone
        assert applied["status"] == {"phase": "Pending", "observedGeneration": 1}
        assert applied["metadata"]["generation"] == 2

    def test_the_status_of_a_missing_object_is_not_found(self, api: KubeApi, ns: str) -> None:
        with pytest.raises(KubeError) as error:
            api.apply_status(ns, "nobody", {"phase": "Pending"})
        assert error.value.status == 404

    def test_a_replace_from_a_stale_version_is_a_conflict(self, api: KubeApi, ns: str) -> None:
        first = api.apply(config_map(ns, "cm", {"a": "1"}))
        first.pop("status", None)
        newer = api.replace({**first, "data": {"k": "w"}})
        assert newer["data"] == {"k": "w"}
        assert newer["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
        with pytest.raises(KubeError) as error:
            api.replace({**first, "data": {"k": "x"}})
        assert error.value.status == 409
        got = api.get(Ref("v1", "ConfigMap", ns, "cm"))
        assert got is not None
        assert got["data"] == {"k": "w"}

    def test_list_selects_by_every_label(self, api: KubeApi, ns: str) -> None:
        api.apply(config_map(ns, "one", {"app": "x", "trial": "1"}))
        api.apply(config_map(ns, "two", {"app": "x", "trial": "2"}))
        api.apply(config_map(ns, "other", {"app": "y"}))
        names = sorted(o["metadata"]["name"] for o in api.list("v1", "ConfigMap", ns, {"app": "x"}))
        assert names == ["one", "two"]
        (only,) = api.list("v1", "ConfigMap", ns, {"app": "x", "trial": "2"})
        assert only["metadata"]["name"] == "two"
        assert only["kind"] == "ConfigMap"

    def test_delete_says_whether_there_was_something_to_delete(self, api: KubeApi, ns: str) -> None:
        api.apply(config_map(ns, "gone", {}))
        target = Ref("v1", "ConfigMap", ns, "gone")
        assert api.delete(target) is True
        assert api.get(target) is None
        assert api.delete(target) is False

    def test_discovery_finds_what_the_cluster_serves_and_nothing_else(
        self, api: KubeApi, ns: str
    ) -> None:
        assert api.has_api("apps/v1", "deployments")
        assert api.has_api("slotune.dev/v1alpha1", "llmdeployments")
        assert not api.has_api("apps/v1", "llmdeployments")  # a served group, another resource
        assert not api.has_api("absent.slotune.dev/v1", "things")  # a group nobody serves
