"""Kopf's record of the last handled spec is a digest: small whatever the spec's size, and
still telling Kopf whether the spec changed."""

from __future__ import annotations

import json
from typing import Any

import kopf

from slotune.handlers import DigestDiffBaseStorage

PREFIX = "slotune.dev"


def storage() -> DigestDiffBaseStorage:
    return DigestDiffBaseStorage(
        prefix=PREFIX, progress=kopf.AnnotationsProgressStorage(prefix=PREFIX)
    )


def body(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "slotune.dev/v1alpha1",
            "kind": "LLMDeployment",
            "metadata": {"name": "m", "namespace": "ns", "annotations": annotations or {}},
            "spec": spec,
        }
    )


def stored(store: DigestDiffBaseStorage, obj: kopf.Body) -> dict[str, Any]:
    """The annotations a `store` would patch onto the object, as the server would keep them."""
    patch = kopf.Patch()
    store.store(body=obj, patch=patch, essence=store.build(body=obj))
    kept = {**obj.metadata.annotations, **patch["metadata"]["annotations"]}
    return {k: v for k, v in kept.items() if v is not None}


def test_an_unchanged_spec_is_no_change_and_an_edit_is_one() -> None:
    store = storage()
    spec = {"engine": {"extraArgs": ["--chat-template", "x" * 300_000]}}
    annotations = stored(store, body(spec))
    assert len(json.dumps(annotations)) < 200  # a digest and Kopf's marker, not 300 KB
    assert store.fetch(body=body(spec)) is None  # not yet stored there: a creation
    same = body(spec, annotations)
    assert store.fetch(body=same) == store.build(body=same)  # no diff: nothing to handle
    edited = body({"engine": {"extraArgs": ["--chat-template", "y"]}}, annotations)
    assert store.fetch(body=edited) == {}  # differs from what was built: an update


def test_an_earlier_versions_full_copy_is_read_once_then_replaced() -> None:
    store = storage()
    spec = {"replicas": 2}
    full_key = f"{PREFIX}/last-handled-configuration"
    old = body(spec, {full_key: json.dumps({"spec": {"replicas": 1}})})
    assert store.fetch(body=old) == {"spec": {"replicas": 1}}  # as Kopf had it: an update
    annotations = stored(store, old)
    assert full_key not in annotations
    assert store.fetch(body=body(spec, annotations)) == store.build(body=body(spec))
