"""An in-memory Kubernetes API for unit tests: the `KubeApi` operations a reconcile and a study
step make, held to the real API server's behaviour by `support.kube_conformance` (run against
both). Every write may be made the last one before a crash, for tests of restarts."""

from __future__ import annotations

import copy
import functools
import itertools
from typing import Any

from slotune import crdgen
from slotune.kube import KubeError, Ref

# Resources with a status subresource: a main-resource write leaves their status alone, and
# their generation moves only when the spec does.
_STATUS_SUBRESOURCE = {"LLMDeployment", "Deployment", "Job", "Pod", "Service"}


@functools.cache
def _spec_defaults() -> dict[str, Any]:
    """The defaults the CRD declares on `spec`'s own fields, which the API server fills in on
    every write (nested defaults apply only where their parent is written, and no test relies
    on them)."""
    schema = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    return {k: v["default"] for k, v in spec["properties"].items() if "default" in v}


class Crash(Exception):  # noqa: N818 - the operator process dying, not an error
    pass


SERVED = frozenset(
    {
        ("apps/v1", "deployments"),
        ("batch/v1", "jobs"),
        ("coordination.k8s.io/v1", "leases"),
        ("networking.k8s.io/v1", "networkpolicies"),
        ("slotune.dev/v1alpha1", "llmdeployments"),
    }
)
"""The named API groups' resources a cluster with slotune's CRD serves (what `has_api`
discovers); the Prometheus Operator's are not among them unless a test adds them."""


class MemoryApi:
    """Objects by (apiVersion, kind, namespace, name)."""

    def __init__(
        self,
        crash_before_write: int | None = None,
        served: frozenset[tuple[str, str]] = SERVED,
    ) -> None:
        self.served = served
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.writes = 0
        self.crash_before_write = crash_before_write
        self._versions = itertools.count(1)
        self._uids = itertools.count(1)

    def _write(self) -> None:
        self.writes += 1
        if self.writes == self.crash_before_write:
            raise Crash

    @staticmethod
    def _key(ref: Ref) -> tuple[str, str, str, str]:
        return (ref.api_version, ref.kind, ref.namespace, ref.name)

    def _store(self, key: tuple[str, str, str, str], new: dict[str, Any]) -> dict[str, Any]:
        new["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[key] = new
        return copy.deepcopy(new)

    def _written(self, obj: dict[str, Any], existing: dict[str, Any] | None) -> dict[str, Any]:
        """`obj` as the server would keep it in place of `existing`."""
        new = copy.deepcopy(obj)
        meta = new["metadata"]
        meta.pop("resourceVersion", None)
        if new["kind"] == "LLMDeployment" and "spec" in new:
            new["spec"] = {**copy.deepcopy(_spec_defaults()), **new["spec"]}
        if existing is None:
            meta["uid"] = f"uid-{next(self._uids)}"
            meta["generation"] = 1
            return new
        meta["uid"] = existing["metadata"]["uid"]
        meta["generation"] = existing["metadata"]["generation"]
        if existing.get("spec") != new.get("spec"):
            meta["generation"] += 1
        if new["kind"] in _STATUS_SUBRESOURCE:
            new["status"] = copy.deepcopy(existing.get("status", {}))
        return new

    def get(self, ref: Ref) -> dict[str, Any] | None:
        found = self.objects.get(self._key(ref))
        return copy.deepcopy(found) if found is not None else None

    def apply(self, obj: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        self._write()
        key = self._key(Ref.of(obj))
        existing = self.objects.get(key)
        if subresource == "status":
            if existing is None:
                raise KubeError(404, "NotFound", f"{key[1]} {key[3]} not found")
            updated = copy.deepcopy(existing)
            updated["status"] = copy.deepcopy(obj["status"])
            return self._store(key, updated)
        new = self._written(obj, existing)
        if existing is None and new["kind"] in _STATUS_SUBRESOURCE:
            new.pop("status", None)  # a create through the main resource sets no status
        return self._store(key, new)

    def apply_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": "slotune.dev/v1alpha1",
            "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        return self.apply(body, subresource="status")

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._write()
        key = self._key(Ref.of(obj))
        existing = self.objects.get(key)
        if existing is None:
            raise KubeError(404, "NotFound", f"{key[1]} {key[3]} not found")
        sent = obj["metadata"].get("resourceVersion")
        if sent and sent != existing["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        return self._store(key, self._written(obj, existing))

    def list(
        self, api_version: str, kind: str, namespace: str, labels: dict[str, str]
    ) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(obj)
            for (v, k, ns, _), obj in self.objects.items()
            if (v, k, ns) == (api_version, kind, namespace)
            and all(obj["metadata"].get("labels", {}).get(a) == b for a, b in labels.items())
        ]

    def delete(self, ref: Ref) -> bool:
        self._write()
        return self.objects.pop(self._key(ref), None) is not None

    def has_api(self, group_version: str, plural: str) -> bool:
        return (group_version, plural) in self.served


def roll_out(deployment: dict[str, Any]) -> None:
    """The Deployment controller and kubelet in one step: every replica of the Deployment's
    current template updated, ready and available."""
    replicas = deployment["spec"]["replicas"]
    deployment["status"] = {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    }
