"""What a study step looks at, read from the API: each object at most once a step, and only
those the step asks for (a finished study reads nothing)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from slotune import render
from slotune.kube import KubeApi, Ref
from slotune.study import trials
from slotune.study.context import Quarantine
from slotune.tuner.records import TrialRecord, loads_readable

T = TypeVar("T")


class KubeObservation:
    """`context.Observation` over the API server (or its in-memory stand-in), for one step."""

    def __init__(self, kube: KubeApi, owner: render.Owner, kind: str) -> None:
        self.kube = kube
        self.owner = owner
        self.kind = kind  # the engine's: the serving pods' selector names it
        self._seen: dict[Hashable, Any] = {}

    def _once(self, key: Hashable, read: Callable[[], T]) -> T:
        if key not in self._seen:
            self._seen[key] = read()
        found: T = self._seen[key]
        return found

    def _kept(self, study: int) -> tuple[list[TrialRecord], Quarantine]:
        def read() -> tuple[list[TrialRecord], Quarantine]:
            name = render.child_name(self.owner, "trials")
            config_map = self.kube.get(Ref("v1", "ConfigMap", self.owner.namespace, name))
            if config_map is None or not trials.controlled_by(config_map, self.owner.uid):
                return [], Quarantine()  # someone else's is a conflict (`reconcile`)
            data = config_map.get("data") or {}
            kept = data.get(render.QUARANTINE_KEY, "")  # whichever study's: a person clears it
            if data.get("study") != str(study):
                return [], Quarantine(kept=kept)
            records, unreadable = loads_readable(data.get(render.RECORDS_KEY, ""))
            kept += "".join(line + "\n" for line, _ in unreadable)
            return records, Quarantine(kept=kept, new=[why for _, why in unreadable])

        return self._once(("records", study), read)

    def records(self, study: int) -> list[TrialRecord]:
        return self._kept(study)[0]

    def quarantine(self, study: int) -> Quarantine:
        return self._kept(study)[1]

    def trial_objects(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            for api_version, kind, component in (
                ("v1", "Pod", render.TRIAL_COMPONENT),
                ("batch/v1", "Job", render.LOAD_COMPONENT),
                ("networking.k8s.io/v1", "NetworkPolicy", render.TRIAL_COMPONENT),
            ):
                labels = {render.LABEL_OWNER: self.owner.name, render.LABEL_COMPONENT: component}
                for obj in self.kube.list(api_version, kind, self.owner.namespace, labels):
                    found.append({**obj, "apiVersion": api_version, "kind": kind})
            return found

        return self._once("trial objects", read)

    def trial_pod(self, name: str) -> dict[str, Any] | None:
        return self._once(
            ("pod", name), lambda: self.kube.get(Ref("v1", "Pod", self.owner.namespace, name))
        )

    def trial_policy(self, name: str) -> dict[str, Any] | None:
        return self._once(
            ("policy", name),
            lambda: self.kube.get(
                Ref("networking.k8s.io/v1", "NetworkPolicy", self.owner.namespace, name)
            ),
        )

    def load_job(self, name: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        def read() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
            ns = self.owner.namespace
            job = self.kube.get(Ref("batch/v1", "Job", ns, name))
            if job is None:
                return None, []
            # The pods the Job controller made carry the Job's UID (anyone may name a pod
            # like a Job's; `trials.LoadState` also checks their owner reference).
            uid = job["metadata"].get("uid", "")
            return job, self.kube.list("v1", "Pod", ns, {trials.JOB_CONTROLLER_UID: uid})

        return self._once(("job", name), read)

    def serving_pods(self, config_hash: str) -> list[dict[str, Any]]:
        labels = {
            **render.selector_labels(self.owner, self.kind),
            render.LABEL_CONFIG_HASH: config_hash,
        }
        return self._once(
            ("serving", config_hash),
            lambda: self.kube.list("v1", "Pod", self.owner.namespace, labels),
        )
