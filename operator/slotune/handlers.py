"""The Kopf edge: the only module that imports `kopf`.

Every trigger — create, resume after a restart, spec update, the periodic resync, and any
change to an owned Deployment or Service (drift, deletion, readiness) — runs the same
level-based `reconcile.reconcile`. Kopf keeps its own bookkeeping in `slotune.dev/`
annotations; slotune's state lives in `status`, written by `reconcile` itself.

No handler needs a finalizer, so Kopf puts none on an LLMDeployment (and takes off the one an
earlier version put there): `kubectl delete` completes while the operator is down, and so does
deleting the CRD. The children go by their owner references, through the garbage collector.
That is why the periodic resync is a task of slotune's own rather than a Kopf timer: Kopf
holds a finalizer on every object that has a timer.
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import kopf

from slotune import models, opmetrics, render, study
from slotune.backoff import Backoff
from slotune.kube import (
    CachedKube,
    Kube,
    KubeError,
    RateLimit,
    Ref,
    in_cluster_server,
    load_api_client,
    slim,
)
from slotune.leader import LeaderElector, standby_health
from slotune.locks import KeyedLocks
from slotune.monitor import PrometheusMonitor
from slotune.reconcile import Monitor, Reconciled, reconcile
from slotune.settings import OperatorSettings
from slotune.status import clip

# Steps a study may take in one handler call before it waits for the next trigger.
MAX_STEPS = 8
QUEUE_WORKERS_PER_THREAD = 4
"""Kopf's per-object workers allowed per handler thread: more than the threads, so that a
worker waiting out its idle second does not keep a thread idle; few enough that a burst of
events on every object is not all held in memory at once."""
Clock = Callable[[], datetime]
# The longest message of a handler's error: Kopf keeps it in the object's annotations.
ERROR_LIMIT = 1024
KopfLogger = logging.Logger | logging.LoggerAdapter[Any]

log = logging.getLogger(__name__)

try:  # glibc's, for `_trim_heap`
    _LIBC: Any = ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim  # noqa: B018 - present on glibc only
except (OSError, AttributeError):
    _LIBC = None

# Per object: a lock so that two triggers never reconcile it at once (kept while in use), and
# its retry back-off (dropped when the object is deleted).
_locks = KeyedLocks()
_backoff = Backoff()


@dataclasses.dataclass(frozen=True)
class _Seen:
    """An LLMDeployment as the operator last saw it: as read, or as its own status write left
    it (without managedFields), with its resourceVersion and `_essence`."""

    body: dict[str, Any]
    version: str
    essence: str


# Per object, its `_Seen`. A body the resync's listing delivered is reconciled as it is when
# it matches (the same version, or the same essence: Kopf's bookkeeping patches move only the
# version); a child's event reconciles its owner from the body itself; otherwise (a create, a
# spec edit, a resume) the object is read afresh.
_seen: dict[tuple[str, str], _Seen] = {}
# The uids of LLMDeployments deleted lately: their children's events (the garbage collector
# deleting them) are not their owner's business any more. Bounded, oldest first out.
_gone: OrderedDict[str, None] = OrderedDict()
GONE_KEPT = 4096
_state: dict[str, Any] = {
    "clock": lambda: datetime.now(UTC),
    "kubeconfig": None,
    "monitor": None,
    "namespaces": [],
    "settings": OperatorSettings(),
}


def _settings() -> OperatorSettings:
    settings: OperatorSettings = _state["settings"]
    return settings


def _trial_settings() -> study.Settings:
    settings = _settings()
    return study.Settings(
        load_image=settings.load_image, startup_seconds=settings.trial_startup_seconds
    )


def _new_kube() -> CachedKube:
    """A client for the operator's own calls: a connection for each thread that may call (the
    handlers' and the resync's, plus a few), under the client-side rate limit, with the
    serving children cached from the watches."""
    settings = _settings()
    return CachedKube(
        load_api_client(_state["kubeconfig"], connections=2 * settings.workers + 4),
        rate_limit=RateLimit(settings.kube_qps, settings.kube_burst),
        on_request=opmetrics.record_request,
    )


def _kube(memo: Any) -> CachedKube:
    if getattr(memo, "kube", None) is None:
        memo.kube = _new_kube()
    kube: CachedKube = memo.kube
    return kube


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """Kopf's record of the last handled spec, kept as its digest, not a copy: a copy in an
    annotation grows with the spec, and a spec near the annotations' 256 KiB limit left the
    object unpatchable (and so undeletable while it had a finalizer). Reconciles are level
    based and never read Kopf's diff, so whether the spec changed is all Kopf needs: a
    digest that matches gives back the current essence (no change), any other stored value
    an empty one (a change). A full copy written by an earlier version is read once, then
    replaced."""

    DIGEST_KEY = "last-handled-digest"

    def __init__(self, *, prefix: str, progress: kopf.ProgressStorage) -> None:
        super().__init__(prefix=prefix, key="last-handled-configuration")
        self._progress = progress

    def _digest(self, essence: Any) -> str:
        cleared = self._progress.clear(essence=essence)
        encoded = json.dumps(cleared, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(encoded.encode()).hexdigest()

    def fetch(self, *, body: kopf.Body) -> Any:
        annotations = body.metadata.annotations
        stored = next(
            (
                annotations[k]
                for k in self.make_keys(self.DIGEST_KEY, body=body)
                if k in annotations
            ),
            None,
        )
        if stored is None:
            return super().fetch(body=body)  # an earlier version's copy, or nothing: a creation
        current = self.build(body=body)
        return current if stored.strip() == self._digest(current) else {}

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        for key in self.make_keys(self.DIGEST_KEY, body=body):
            patch.metadata.annotations[key] = self._digest(essence)
        for key in self.make_keys(self.key, body=body):
            if key in body.metadata.annotations:
                patch.metadata.annotations[key] = None  # the earlier version's full copy
        self._store_marker(prefix=self.prefix, patch=patch, body=body)

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        essence = super().build(body=body, extra_fields=extra_fields)
        self.remove_annotations(essence, set(self.make_keys(self.DIGEST_KEY, body=body)))
        self.remove_empty_stanzas(essence)
        return essence


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: Any, logger: KopfLogger, **_: Any) -> None:
    """Keeps Kopf's bookkeeping out of `status` and its log lines out of the event stream."""
    progress = kopf.AnnotationsProgressStorage(prefix=models.GROUP)
    settings.persistence.progress_storage = progress
    settings.persistence.diffbase_storage = DigestDiffBaseStorage(
        prefix=models.GROUP, progress=progress
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    # Handlers are synchronous and mostly wait on the API server or Prometheus: enough threads
    # that a slow object never delays another's deletion or a study's next step.
    settings.execution.max_workers = _settings().workers
    # Kopf starts a worker per object with events waiting, unbounded by default: creating or
    # editing 500 objects at once started 500, each holding its event's body and its handler's
    # state while it waited for a thread. The burst left 250-290 MiB behind (Python's arenas
    # keep what it fragmented); a few workers per thread, each freeing its slot a second after
    # its object's last event, held 500 objects at about 150 MiB with the same throughput
    # (bench/results/scale.md).
    settings.queueing.worker_limit = QUEUE_WORKERS_PER_THREAD * _settings().workers
    settings.queueing.idle_timeout = 1.0
    _kube(memo)
    port = _settings().metrics_port
    if port is not None:
        opmetrics.serve(port)
        logger.info("Serving the operator's metrics on port %d", port)
    logger.info("Started the slotune operator")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod, the ServiceAccount, at the address the kubelet gives (Kopf's own login always
    dials kubernetes.default.svc); elsewhere, the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
    if info is not None:
        return dataclasses.replace(info, server=in_cluster_server(os.environ))
    found: kopf.ConnectionInfo | None = kopf.login_with_kubeconfig(**kwargs)
    return found


class _NotDue(Exception):  # noqa: N818 - a routine retry that came early: not an error
    """A routine retry of an object still backing off: nothing was done."""

    def __init__(self, remaining: float) -> None:
        super().__init__(f"backing off for {remaining:.0f}s more")
        self.remaining = remaining


def _run(
    body: dict[str, Any],
    memo: Any,
    logger: KopfLogger,
    *,
    routine: bool = False,
    delivered: bool = False,
    owner_uid: str | None = None,
) -> Reconciled:
    """Reconciles one object. A `routine` pass (the resync, a child's event, Kopf's retry of
    a failed handler) of an object that is backing off after failures raises `_NotDue`
    instead; Kopf's first call for a create, resume or spec edit is always tried at once.
    The first step reconciles from what the operator last saw of the object (`_last_seen`)
    when the trigger allows: a `delivered` body (the resync's listing) that matches it, or,
    for a child's event naming its owner's `owner_uid`, the body last seen of that uid.
    Otherwise, and for every later step, the object is read afresh. (Kopf's own events are
    read afresh too: taking them as delivered, when they matched, spared a read but let
    Kopf's bookkeeping patches arrive faster than the API server took them: 218 HTTP 429s
    in the one 500-object update storm measured that way.)"""
    meta = body["metadata"]
    kube = _kube(memo)
    ref = Ref(models.API_VERSION, models.KIND, meta["namespace"], meta["name"])
    monitor: Monitor | None = _state["monitor"]
    outcome = Reconciled(status=models.LLMDeploymentStatus())
    key = (meta["namespace"], meta["name"])
    with _locks.hold(key):
        remaining = _backoff.remaining(key)
        if routine and remaining > 0:
            raise _NotDue(remaining)
        # A study may take several steps in a row (record a trial, clean up, plan the next);
        # each step reads the object afresh, so none computes from a replaced status.
        for step in range(MAX_STEPS):
            started, failed = time.monotonic(), True
            try:
                seen = (
                    _last_seen(key, body if delivered else None, owner_uid) if step == 0 else None
                )
                fresh = seen if seen is not None else kube.get(ref)
                if fresh is None or fresh["metadata"].get("deletionTimestamp"):
                    _forget(key)
                    failed = False
                    return outcome
                now = _state["clock"]().replace(microsecond=0)
                outcome = reconcile(fresh, kube, now, monitor=monitor, settings=_trial_settings())
                failed = outcome.apply_failure is not None
            except KubeError as exc:
                delay = _backoff.failed(key)
                raise kopf.TemporaryError(
                    f"Kubernetes API call failed: {exc}; retrying in {delay:.0f}s", delay=delay
                ) from exc
            finally:
                opmetrics.record_reconcile(time.monotonic() - started, error=failed)
            if outcome.seen is not None:
                kept = slim(outcome.seen)
                _seen[key] = _Seen(
                    kept, kept["metadata"].get("resourceVersion", ""), _essence(kept)
                )
            opmetrics.observe(meta["namespace"], meta["name"], outcome.status, outcome.spec)
            _report(fresh, outcome, logger, kube)
            if outcome.apply_failure is not None:
                delay = _backoff.failed(key)
                raise kopf.TemporaryError(
                    clip(f"{outcome.apply_failure}; retrying in {delay:.0f}s", ERROR_LIMIT),
                    delay=delay,
                )
            _backoff.succeeded(key)
            if not outcome.progressed:
                break
    return outcome


def _essence(body: dict[str, Any]) -> str:
    """The digest of what a reconcile reads of an LLMDeployment."""
    meta = body.get("metadata") or {}
    read = {
        "metadata": {k: meta.get(k) for k in ("uid", "generation", "deletionTimestamp")},
        "spec": body.get("spec"),
        "status": body.get("status"),
    }
    return hashlib.sha256(json.dumps(read, sort_keys=True).encode()).hexdigest()


def _last_seen(
    key: tuple[str, str], delivered: dict[str, Any] | None, owner_uid: str | None
) -> dict[str, Any] | None:
    """A copy of the body to reconcile `key` from without reading it, or None: the `delivered`
    body if it shows the object as the operator last saw it; for a child's event, the body
    last seen if it has the child's owner's uid (an object deleted and created again under
    the same name is read afresh)."""
    seen = _seen.get(key)
    if seen is None:
        return None
    if delivered is not None:
        version = delivered["metadata"].get("resourceVersion")
        if (version and version == seen.version) or _essence(delivered) == seen.essence:
            return copy.deepcopy(delivered)
        return None
    if owner_uid is not None and seen.body["metadata"].get("uid") == owner_uid:
        return copy.deepcopy(seen.body)
    return None


def _forget(key: tuple[str, str]) -> None:
    """Drops what the operator keeps about a deleted object: its metrics, back-off and last
    versions. (Its lock is kept only while a pass holds it: `KeyedLocks`.)"""
    opmetrics.forget(*key)
    _backoff.forget(key)
    _seen.pop(key, None)


def _report(body: dict[str, Any], outcome: Reconciled, logger: KopfLogger, kube: Kube) -> None:
    meta = body["metadata"]
    now = _state["clock"]().strftime("%Y-%m-%dT%H:%M:%SZ")
    for event in outcome.events:
        try:
            kube.post_event(
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
            f", tuning: {tuning_status.message}" if tuning_status and tuning_status.message else "",
        )


@kopf.on.resume(models.GROUP, models.VERSION, models.PLURAL)
@kopf.on.create(models.GROUP, models.VERSION, models.PLURAL)
@kopf.on.update(models.GROUP, models.VERSION, models.PLURAL)
def reconcile_llm_deployment(
    body: kopf.Body, memo: Any, logger: KopfLogger, retry: int, **_: Any
) -> None:
    """Creates or corrects the children; an unservable spec fails permanently until edited,
    a failure to apply is retried with back-off."""
    try:
        outcome = _run(dict(body), memo, logger, routine=retry > 0)
    except _NotDue as early:  # the resync retried it meanwhile: wait out its back-off
        raise kopf.TemporaryError(str(early), delay=early.remaining) from None
    if outcome.invalid is not None:
        # Kopf keeps the message in an annotation: bounded, the whole text is in the status.
        raise kopf.PermanentError(clip(f"Invalid spec: {outcome.invalid}", ERROR_LIMIT))


@kopf.on.startup()
async def start_resync(memo: Any, **_: Any) -> None:
    """Starts the periodic level-based pass over every LLMDeployment (see the module's
    docstring for why it is not a Kopf timer)."""
    memo.resync = asyncio.create_task(_resync_forever(memo), name="slotune resync")


@kopf.on.cleanup()
async def stop_resync(memo: Any, **_: Any) -> None:
    task: asyncio.Task[None] | None = getattr(memo, "resync", None)
    if task is not None:
        task.cancel()


async def _resync_forever(memo: Any) -> None:
    """Every resync period, each LLMDeployment is reconciled once more (refreshing status and
    repairing what the watches missed), in a pool of its own; an object whose last pass is
    still running (a study step that launches a trial, say) is left to finish it.

    The objects of one pass are spread evenly over the period rather than started at once:
    500 reconciles queued together on 16 threads each waited on the others for the
    interpreter, which stretched a reconcile of a few milliseconds to most of a second."""
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=_settings().workers, thread_name_prefix="resync")
    running: set[tuple[str, str]] = set()
    period = _settings().resync_seconds
    await asyncio.sleep(period)
    while True:
        started = loop.time()
        await loop.run_in_executor(pool, _trim_heap)  # what the last period freed
        try:
            listed = await loop.run_in_executor(pool, _listed, memo)
        except KubeError as exc:
            log.warning("Could not list the LLMDeployments to resync: %s", exc)
            listed = []
        gap = period / max(len(listed), 1)
        for index, body in enumerate(listed):
            await asyncio.sleep(max(0.0, started + index * gap - loop.time()))
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            if key in running or not _backoff.due(key):
                continue  # still running its last pass, or backing off after failures
            running.add(key)
            future = loop.run_in_executor(pool, _resync, body, memo)
            future.add_done_callback(functools.partial(_done, running, key))
        await asyncio.sleep(max(0.0, started + period - loop.time()))


def _trim_heap() -> None:
    """Hands the C heap's free pages back to the system (glibc's malloc_trim). Python frees
    the objects of a deleted LLMDeployment, its watch events and its reconciles, but glibc
    keeps the freed pages: without this, the operator's memory never went down after a burst
    of work or a bulk delete. Elsewhere (musl) there is no such call, and nothing to do."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _done(running: set[tuple[str, str]], key: tuple[str, str], _: object) -> None:
    running.discard(key)


def _listed(memo: Any) -> list[dict[str, Any]]:
    kube = _kube(memo)
    namespaces: list[str] = _state["namespaces"]
    if not namespaces:
        return kube.list_llm_deployments()
    return [obj for ns in namespaces for obj in kube.list_llm_deployments(ns)]


def _resync(body: dict[str, Any], memo: Any) -> None:
    meta = body["metadata"]
    # Kopf's formatter prefixes `[namespace/name]` to a record carrying k8s_ref.
    logger = logging.LoggerAdapter(log, {"k8s_ref": {k: meta[k] for k in ("namespace", "name")}})
    try:
        _run(body, memo, logger, routine=True, delivered=True)
    except _NotDue:  # Kopf's retry ran it meanwhile
        pass
    except kopf.TemporaryError as exc:  # the next pass tries again
        logger.warning("Resync of %s/%s failed: %s", meta["namespace"], meta["name"], exc)
    except Exception:  # one object's bug must not end the resync of every other
        logger.exception("Resync of %s/%s failed", meta["namespace"], meta["name"])


@kopf.on.event(models.GROUP, models.VERSION, models.PLURAL)
def on_llm_deployment_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """A deleted LLMDeployment's metrics, back-off and cached children go with it, and its
    uid joins `_gone`."""
    if event.get("type") == "DELETED":
        meta = event["object"]["metadata"]
        key = (meta["namespace"], meta["name"])
        _forget(key)
        if meta.get("uid"):
            _gone[meta["uid"]] = None
            while len(_gone) > GONE_KEPT:
                _gone.popitem(last=False)
        kube: CachedKube | None = getattr(memo, "kube", None)
        if kube is not None:
            kube.forget(*key)


def _controller_uid(child: Mapping[str, Any]) -> str | None:
    """The uid of the LLMDeployment that controls `child`, if one does."""
    for ref in (child.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == models.KIND and ref.get("controller"):
            return str(ref.get("uid") or "") or None
    return None


def _reconcile_owner(body: kopf.Body, memo: Any, logger: KopfLogger, *, going: bool) -> None:
    """Reconciles the LLMDeployment that `body` (a child) names. A child `going` (deleted, or
    being deleted) has its owner read afresh: the garbage collector deletes children after
    their owner, whose own DELETED event may never come (deleting the CRD ends the watch
    instead), and children applied from the owner's last-seen body would be created again,
    collected again, and so on."""
    labels = body.metadata.labels or {}
    owner_name = labels.get(render.LABEL_OWNER)
    namespace = body.metadata.namespace
    if not owner_name or not namespace:
        return
    # The owner's uid: from the child's owner reference, or for a pod (its ReplicaSet's) from
    # the serving Deployment of that name as the watch last delivered it.
    owner_uid = _controller_uid(body) or _controller_uid(
        _kube(memo).peek(Ref("apps/v1", "Deployment", namespace, owner_name)) or {}
    )
    if owner_uid in _gone:
        return  # the garbage collector at work after a delete
    # Routine: a child's churn (the Deployment's status moving) while its owner backs off
    # must not retry it early; the resync does once the back-off ends.
    owner = {"metadata": {"namespace": namespace, "name": owner_name}}
    _run(owner, memo, logger, routine=True, owner_uid=None if going else owner_uid)


_CHILD_LABELS = {render.LABEL_MANAGED_BY: render.MANAGED_BY}


@kopf.on.event("apps/v1", "deployments", labels=_CHILD_LABELS)
@kopf.on.event("v1", "services", labels=_CHILD_LABELS)
@kopf.on.event("v1", "pods", labels=_CHILD_LABELS)
@kopf.on.event("batch/v1", "jobs", labels=_CHILD_LABELS)
def on_child_event(
    event: kopf.RawEvent, body: kopf.Body, memo: Any, logger: KopfLogger, **_: Any
) -> None:
    """A child changed, was edited by hand or deleted: reconcile its LLMDeployment. (The
    serving children's cache learns of it first.)"""
    obj = dict(event.get("object") or {})
    if event.get("type") == "DELETED":
        _kube(memo).deleted(obj)
    else:
        _kube(memo).observed(obj)
    if event.get("type") is None:  # the initial listing; resume handles those
        return
    going = event.get("type") == "DELETED" or bool(body.metadata.get("deletionTimestamp"))
    try:
        _reconcile_owner(body, memo, logger, going=going)
    except _NotDue:
        pass
    except kopf.TemporaryError as exc:
        logger.warning("Could not reconcile the owner of %s yet: %s", body.metadata.name, exc)


# Kopf logs each event handler's success at INFO: a line per watch event of every child and
# LLMDeployment, most of the log at scale, saying nothing. What they do that matters (an event
# posted, a status written) is logged by `_report`.
_QUIET_LINES = {
    f"Handler {name!r} succeeded." for name in ("on_child_event", "on_llm_deployment_event")
}


def _quiet_watch_handlers(record: logging.LogRecord) -> bool:
    return not (record.levelno == logging.INFO and record.getMessage() in _QUIET_LINES)


def run(
    *,
    namespaces: list[str],
    kubeconfig: str | None = None,
    liveness_endpoint: str | None = None,
    clock: Clock | None = None,
) -> None:
    """Runs the operator until it is stopped (SIGINT/SIGTERM). Its settings come from the
    environment (`slotune.settings`); one it cannot use raises SettingsError before anything
    starts."""
    settings = OperatorSettings.from_env()
    _state["settings"] = settings
    _state["kubeconfig"] = kubeconfig
    _state["namespaces"] = list(namespaces)
    _state["monitor"] = PrometheusMonitor(default_url=settings.prometheus_url)
    if clock is not None:
        _state["clock"] = clock
    if kubeconfig is not None:
        os.environ["KUBECONFIG"] = kubeconfig  # Kopf's own login reads it
    kopf.configure(verbose=False, log_prefix=True)  # every object's line names it
    logging.getLogger("kopf.objects").addFilter(_quiet_watch_handlers)
    elector = _lead(settings, liveness_endpoint)
    stop = threading.Event()
    if elector is not None:
        threading.Thread(
            target=_hold, args=(elector, stop), name="slotune lease", daemon=True
        ).start()
    try:
        kopf.run(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness_endpoint,
        )
    finally:
        stop.set()
        if elector is not None:
            elector.release()


def _lead(settings: OperatorSettings, liveness_endpoint: str | None) -> LeaderElector | None:
    """With leader election on, waits until this replica holds the Lease (answering its
    liveness probe meanwhile: a standby is healthy) and returns its elector."""
    if settings.leader_lease is None:
        return None
    namespace, name = settings.leader_lease
    identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(_new_kube(), namespace, name, identity)
    with standby_health(liveness_endpoint):
        elector.acquire()
    return elector


def _hold(elector: LeaderElector, stop: threading.Event) -> None:
    """Renews the Lease; a leader that could not must stop acting before another replica
    takes over, so the process ends at once (its pod restarts as a standby)."""
    elector.keep(stop)
    if not stop.is_set():
        log.critical("Exiting: this replica is no longer the leader")
        logging.shutdown()
        os._exit(1)
