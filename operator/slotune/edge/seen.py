"""What the operator last saw of each LLMDeployment, so that a pass may reconcile from a body
it already holds instead of reading the object again, and which LLMDeployments were deleted
lately, so that their children's events (the garbage collector deleting them) are not taken
for their owner's business. Plain data, no I/O."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections import OrderedDict
from typing import Any

from slotune.kube import slim

Key = tuple[str, str]  # an LLMDeployment's namespace and name
GONE_KEPT = 4096


def essence(body: dict[str, Any]) -> str:
    """The digest of what a reconcile reads of an LLMDeployment."""
    meta = body.get("metadata") or {}
    read = {
        "metadata": {k: meta.get(k) for k in ("uid", "generation", "deletionTimestamp")},
        "spec": body.get("spec"),
        "status": body.get("status"),
    }
    return hashlib.sha256(json.dumps(read, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Seen:
    """An LLMDeployment as the operator last saw it: as read, or as its own status write left
    it (without managedFields), with its resourceVersion and `essence`."""

    body: dict[str, Any]
    version: str
    essence: str


class LastSeen:
    """Per object, its `Seen`. A body the resync's listing delivered is reconciled as it is
    when it matches (the same version, or the same essence: Kopf's bookkeeping patches move
    only the version); a child's event reconciles its owner from the body itself; otherwise
    (a create, a spec edit, a resume) the object is read afresh.

    And the uids of LLMDeployments deleted lately: bounded, oldest first out."""

    def __init__(self, gone_kept: int = GONE_KEPT) -> None:
        self.bodies: dict[Key, Seen] = {}
        self.gone: OrderedDict[str, None] = OrderedDict()
        self._gone_kept = gone_kept

    def remember(self, key: Key, body: dict[str, Any]) -> None:
        """Keeps `body` (without managedFields) as the object last seen."""
        kept = slim(body)
        self.bodies[key] = Seen(kept, kept["metadata"].get("resourceVersion", ""), essence(kept))

    def last_seen(
        self, key: Key, delivered: dict[str, Any] | None, owner_uid: str | None
    ) -> dict[str, Any] | None:
        """A copy of the body to reconcile `key` from without reading it, or None: the
        `delivered` body if it shows the object as the operator last saw it; for a child's
        event, the body last seen if it has the child's owner's uid (an object deleted and
        created again under the same name is read afresh)."""
        seen = self.bodies.get(key)
        if seen is None:
            return None
        if delivered is not None:
            version = delivered["metadata"].get("resourceVersion")
            if (version and version == seen.version) or essence(delivered) == seen.essence:
                return copy.deepcopy(delivered)
            return None
        if owner_uid is not None and seen.body["metadata"].get("uid") == owner_uid:
            return copy.deepcopy(seen.body)
        return None

    def forget(self, key: Key) -> None:
        self.bodies.pop(key, None)

    def deleted(self, uid: str) -> None:
        """Notes that the LLMDeployment of `uid` was deleted."""
        self.gone[uid] = None
        while len(self.gone) > self._gone_kept:
            self.gone.popitem(last=False)

    def is_gone(self, uid: str | None) -> bool:
        return uid in self.gone
