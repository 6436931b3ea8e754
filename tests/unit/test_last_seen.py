"""When the operator reconciles from a body it already holds (the resync's listing, the
body it last saw) instead of reading the object again."""

from __future__ import annotations

import copy
import logging
from typing import Any

import kopf
import pytest

from slotune import edge, handlers
from slotune.edge.seen import LastSeen, Seen, essence

KEY = ("prod", "chat")


def body(version: str, **changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "namespace": "prod",
            "name": "chat",
            "uid": "u1",
            "generation": 2,
            "resourceVersion": version,
            "annotations": {"slotune.dev/last-handled-digest": "abc"},
        },
        "spec": {"model": {"name": "m"}},
        "status": {"phase": "Ready", "observedGeneration": 2},
    }
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = obj
        for part in parents:
            target = target[part]
        target[leaf] = value
    return obj


@pytest.fixture
def seen() -> LastSeen:
    cache = LastSeen()
    last = body("10")
    cache.bodies[KEY] = Seen(last, "10", essence(last))
    return cache


def test_the_version_last_seen_is_used_as_a_copy(seen: LastSeen) -> None:
    listed = body("10")
    found = seen.last_seen(KEY, listed, None)
    assert found == listed
    assert found is not listed


def test_a_later_version_that_differs_only_in_bookkeeping_is_used(seen: LastSeen) -> None:
    """Kopf's annotation patch after a handler moves the resourceVersion, nothing else."""
    kopf_patched = body("11", metadata__annotations={"slotune.dev/last-handled-digest": "def"})
    assert seen.last_seen(KEY, kopf_patched, None) == kopf_patched


@pytest.mark.parametrize(
    "changes",
    [
        {"spec": {"model": {"name": "other"}}},
        {"status": {"phase": "Deploying", "observedGeneration": 2}},
        {"metadata__generation": 3},
        {"metadata__uid": "u2"},  # deleted and created again under the same name
        {"metadata__deletionTimestamp": "2026-12-03T20:00:00Z"},
    ],
)
def test_any_change_a_reconcile_reads_is_read_afresh(
    seen: LastSeen, changes: dict[str, Any]
) -> None:
    assert seen.last_seen(KEY, body("12", **changes), None) is None


def test_a_childs_event_uses_the_body_last_seen_of_its_owners_uid(seen: LastSeen) -> None:
    found = seen.last_seen(KEY, None, "u1")
    assert found == body("10")
    assert found is not seen.bodies[KEY].body


def test_another_uid_no_uid_or_nothing_seen_reads_afresh(seen: LastSeen) -> None:
    assert seen.last_seen(KEY, None, "u2") is None  # deleted and created again
    assert seen.last_seen(KEY, None, None) is None  # a pod: its owner is a ReplicaSet
    seen.forget(KEY)
    assert seen.last_seen(KEY, body("10"), None) is None
    assert seen.last_seen(KEY, None, "u1") is None


def test_a_body_is_not_changed_by_the_check(seen: LastSeen) -> None:
    listed = body("11")
    kept = copy.deepcopy(listed)
    seen.last_seen(KEY, listed, None)
    assert listed == kept


class _Cache:
    """The serving children's cache, as a child's event touches it."""

    def observed(self, obj: dict[str, Any]) -> None:
        pass

    def deleted(self, obj: dict[str, Any]) -> None:
        pass

    def peek(self, ref: object) -> None:
        return None


def child(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "namespace": "prod",
            "name": "chat",
            "labels": {"slotune.dev/llmdeployment": "chat"},
            "ownerReferences": [
                {"kind": "LLMDeployment", "name": "chat", "uid": "u1", "controller": True}
            ],
            **metadata,
        },
    }


@pytest.mark.parametrize(
    ("event_type", "metadata", "trusted"),
    [
        ("MODIFIED", {}, "u1"),  # the owner's body last seen may stand in for a read
        ("DELETED", {}, None),  # the garbage collector may be following its owner
        ("MODIFIED", {"deletionTimestamp": "2026-12-04T13:00:00Z"}, None),
    ],
)
def test_a_child_going_has_its_owner_read_afresh(
    monkeypatch: pytest.MonkeyPatch, event_type: str, metadata: dict[str, Any], trusted: str | None
) -> None:
    """Deleting the CRD deletes every LLMDeployment without a DELETED event to the operator;
    the children the garbage collector then deleted were applied again from the owners'
    last-seen bodies, for ever."""
    runs: list[str | None] = []
    services = edge.build(edge.Launch(), kube=_Cache())
    monkeypatch.setattr(
        services.reconciler, "run", lambda body, logger, **kw: runs.append(kw["owner_uid"])
    )
    obj = child(**metadata)
    handlers.on_child_event(
        event={"type": event_type, "object": obj},
        body=kopf.Body(obj),
        memo=kopf.Memo(services=services),
        logger=logging.getLogger(__name__),
    )
    assert runs == [trusted]
