"""One object's pass, whatever triggered it: one at a time per object, after its back-off,
a few study steps in a row, each reconciled by `slotune.reconcile` and reported (events, log
lines, the operator's metrics). The Kopf edge turns its outcome and its two exceptions into
Kopf's; the resync calls it the same way."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from slotune import models, opmetrics, study
from slotune.backoff import Backoff
from slotune.edge.seen import Key, LastSeen
from slotune.kube import CachedKube, KubeError, Ref
from slotune.locks import KeyedLocks
from slotune.reconcile import Monitor, Reconciled, reconcile
from slotune.render import LABEL_OWNER
from slotune.status import clip

# Steps a study may take in one pass before it waits for the next trigger.
MAX_STEPS = 8
# The longest message of a handler's error: Kopf keeps it in the object's annotations.
ERROR_LIMIT = 1024
Clock = Callable[[], datetime]
ObjectLogger = logging.Logger | logging.LoggerAdapter[Any]


class NotDue(Exception):  # noqa: N818 - a routine retry that came early: not an error
    """A routine retry of an object still backing off: nothing was done."""

    def __init__(self, remaining: float) -> None:
        super().__init__(f"backing off for {remaining:.0f}s more")
        self.remaining = remaining


class RetryLater(Exception):  # noqa: N818 - Kopf's TemporaryError, without Kopf
    """The pass failed for now (the API server, a child it would not take): try again after
    `delay` seconds, the object's back-off."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


def controller_uid(child: Mapping[str, Any]) -> str | None:
    """The uid of the LLMDeployment that controls `child`, if one does."""
    for ref in (child.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == models.KIND and ref.get("controller"):
            return str(ref.get("uid") or "") or None
    return None


class Reconciler:
    """Passes over LLMDeployments, with what they keep per object: a lock so that two
    triggers never reconcile it at once (kept while in use), its retry back-off and the body
    last seen (both dropped when the object is deleted)."""

    def __init__(
        self,
        kube: CachedKube,
        *,
        seen: LastSeen,
        trial_settings: study.Settings,
        clock: Clock,
        monitor: Monitor | None = None,
    ) -> None:
        self.kube, self.seen, self.monitor = kube, seen, monitor
        self.trial_settings, self.clock = trial_settings, clock
        self.locks = KeyedLocks()
        self.backoff = Backoff()

    def run(
        self,
        body: dict[str, Any],
        logger: ObjectLogger,
        *,
        routine: bool = False,
        delivered: bool = False,
        owner_uid: str | None = None,
    ) -> Reconciled:
        """Reconciles one object. A `routine` pass (the resync, a child's event, Kopf's retry
        of a failed handler) of an object that is backing off after failures raises `NotDue`
        instead; Kopf's first call for a create, resume or spec edit is always tried at once.
        The first step reconciles from what the operator last saw of the object (`LastSeen`)
        when the trigger allows: a `delivered` body (the resync's listing) that matches it,
        or, for a child's event naming its owner's `owner_uid`, the body last seen of that
        uid. Otherwise, and for every later step, the object is read afresh. (Kopf's own
        events are read afresh too: taking them as delivered, when they matched, spared a
        read but let Kopf's bookkeeping patches arrive faster than the API server took them:
        218 HTTP 429s in the one 500-object update storm measured that way.)"""
        meta = body["metadata"]
        ref = Ref(models.API_VERSION, models.KIND, meta["namespace"], meta["name"])
        outcome = Reconciled(status=models.LLMDeploymentStatus())
        key = (meta["namespace"], meta["name"])
        with self.locks.hold(key):
            remaining = self.backoff.remaining(key)
            if routine and remaining > 0:
                raise NotDue(remaining)
            # A study may take several steps in a row (record a trial, clean up, plan the
            # next); each step reads the object afresh, so none computes from a replaced status.
            for step in range(MAX_STEPS):
                started, failed = time.monotonic(), True
                try:
                    seen = (
                        self.seen.last_seen(key, body if delivered else None, owner_uid)
                        if step == 0
                        else None
                    )
                    fresh = seen if seen is not None else self.kube.get(ref)
                    if fresh is None or fresh["metadata"].get("deletionTimestamp"):
                        self.forget(key)
                        failed = False
                        return outcome
                    now = self.clock().replace(microsecond=0)
                    outcome = reconcile(
                        fresh, self.kube, now, monitor=self.monitor, settings=self.trial_settings
                    )
                    failed = outcome.apply_failure is not None
                except KubeError as exc:
                    delay = self.backoff.failed(key)
                    raise RetryLater(
                        f"Kubernetes API call failed: {exc}; retrying in {delay:.0f}s", delay
                    ) from exc
                finally:
                    opmetrics.record_reconcile(time.monotonic() - started, error=failed)
                if outcome.seen is not None:
                    self.seen.remember(key, outcome.seen)
                opmetrics.observe(meta["namespace"], meta["name"], outcome.status, outcome.spec)
                self._report(fresh, outcome, logger)
                if outcome.apply_failure is not None:
                    delay = self.backoff.failed(key)
                    message = f"{outcome.apply_failure}; retrying in {delay:.0f}s"
                    raise RetryLater(clip(message, ERROR_LIMIT), delay)
                self.backoff.succeeded(key)
                if not outcome.progressed:
                    break
        return outcome

    def child_event(
        self, event_type: str | None, child: dict[str, Any], logger: ObjectLogger
    ) -> None:
        """A child changed, was edited by hand or deleted: the serving children's cache
        learns of it first, then its LLMDeployment is reconciled (the initial listing's
        children are not: resume handles those). It never fails for an owner backing off
        or failing for now: that one waits for its next pass."""
        if event_type == "DELETED":
            self.kube.deleted(child)
        else:
            self.kube.observed(child)
        if event_type is None:
            return
        meta = child.get("metadata") or {}
        going = event_type == "DELETED" or bool(meta.get("deletionTimestamp"))
        try:
            self.run_owner(child, logger, going=going)
        except NotDue:
            pass
        except RetryLater as exc:
            logger.warning("Could not reconcile the owner of %s yet: %s", meta.get("name"), exc)

    def run_owner(self, child: Mapping[str, Any], logger: ObjectLogger, *, going: bool) -> None:
        """Reconciles the LLMDeployment that `child` names. A child `going` (deleted, or
        being deleted) has its owner read afresh: the garbage collector deletes children
        after their owner, whose own DELETED event may never come (deleting the CRD ends the
        watch instead), and children applied from the owner's last-seen body would be
        created again, collected again, and so on."""
        meta = child.get("metadata") or {}
        owner_name = (meta.get("labels") or {}).get(LABEL_OWNER)
        namespace = meta.get("namespace")
        if not owner_name or not namespace:
            return
        # The owner's uid: from the child's owner reference, or for a pod (its ReplicaSet's)
        # from the serving Deployment of that name as the watch last delivered it.
        owner_uid = controller_uid(child) or controller_uid(
            self.kube.peek(Ref("apps/v1", "Deployment", namespace, owner_name)) or {}
        )
        if self.seen.is_gone(owner_uid):
            return  # the garbage collector at work after a delete
        # Routine: a child's churn (the Deployment's status moving) while its owner backs off
        # must not retry it early; the resync does once the back-off ends.
        owner = {"metadata": {"namespace": namespace, "name": owner_name}}
        self.run(owner, logger, routine=True, owner_uid=None if going else owner_uid)

    def due(self, key: Key) -> bool:
        """Whether a routine pass may try `key` now (it is not backing off)."""
        return self.backoff.due(key)

    def forget(self, key: Key) -> None:
        """Drops what the operator keeps about a deleted object: its metrics, back-off and
        last versions. (Its lock is kept only while a pass holds it: `KeyedLocks`.)"""
        opmetrics.forget(*key)
        self.backoff.forget(key)
        self.seen.forget(key)

    def deleted(self, meta: Mapping[str, Any]) -> None:
        """An LLMDeployment was deleted: its metrics, back-off and cached children go with
        it, and its uid is noted as gone."""
        key = (meta["namespace"], meta["name"])
        self.forget(key)
        if meta.get("uid"):
            self.seen.deleted(meta["uid"])
        self.kube.forget(*key)

    def _report(self, body: dict[str, Any], outcome: Reconciled, logger: ObjectLogger) -> None:
        meta = body["metadata"]
        now = self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        for event in outcome.events:
            try:
                self.kube.post_event(
                    body, type_=event.type, reason=event.reason, message=event.message, now=now
                )
            except KubeError as exc:  # an event is news, not state: the status already has it
                logger.warning("Could not post the event %s: %s", event.reason, exc)
            # The same line in the operator's log, for whoever reads it instead of the events.
            logger.info("Event %s %s: %s", event.type, event.reason, event.message)
        if outcome.status_written:
            tuning_status = outcome.status.tuning
            logger.info(
                "Updated status of %s/%s: phase %s%s",
                meta["namespace"],
                meta["name"],
                outcome.status.phase,
                f", tuning: {tuning_status.message}"
                if tuning_status and tuning_status.message
                else "",
            )
