"""Performs a study step's actions, in order, through the API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slotune.kube import KubeApi, Ref
from slotune.study.context import Action, Apply


def execute(kube: KubeApi, actions: Sequence[Action]) -> list[dict[str, Any]]:
    """Applies and deletes in the order decided, and returns what the applies made (as the
    server answered); an error stops there (the step's status is then not written, and the
    next reconcile decides again from what the API holds)."""
    applied: list[dict[str, Any]] = []
    for action in actions:
        if isinstance(action, Apply):
            applied.append(kube.apply(action.obj))
        else:
            kube.delete(Ref(action.api_version, action.kind, action.namespace, action.name))
    return applied
