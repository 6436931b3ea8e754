"""The Kopf edge: the only module that imports `kopf`. It adapts Kopf to the services of
`slotune.edge` and keeps no state of its own: the services are made when the operator starts
(`configure`) and reach every handler through Kopf's `memo`.

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

import dataclasses
import hashlib
import json
import logging
import os
from typing import Any

import kopf

from slotune import edge, models, opmetrics, render
from slotune.edge.leadership import leading
from slotune.edge.reconciler import ERROR_LIMIT, Clock, NotDue, RetryLater
from slotune.kube import in_cluster_server
from slotune.status import clip

QUEUE_WORKERS_PER_THREAD = 4
"""Kopf's per-object workers allowed per handler thread: more than the threads, so that a
worker waiting out its idle second does not keep a thread idle; few enough that a burst of
events on every object is not all held in memory at once."""
KopfLogger = logging.Logger | logging.LoggerAdapter[Any]


def _services(memo: kopf.Memo) -> edge.Services:
    """The services `configure` put in the operator's memo (each object's is a copy of it)."""
    services: edge.Services = memo.services
    return services


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
def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: KopfLogger, **_: Any
) -> None:
    """Keeps Kopf's bookkeeping out of `status` and its log lines out of the event stream,
    and makes the operator's services from what `run` put in the memo."""
    launch: edge.Launch = memo.get("launch") or edge.Launch()
    workers = launch.settings.workers
    progress = kopf.AnnotationsProgressStorage(prefix=models.GROUP)
    settings.persistence.progress_storage = progress
    settings.persistence.diffbase_storage = DigestDiffBaseStorage(
        prefix=models.GROUP, progress=progress
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    # Handlers are synchronous and mostly wait on the API server or Prometheus: enough threads
    # that a slow object never delays another's deletion or a study's next step.
    settings.execution.max_workers = workers
    # Kopf starts a worker per object with events waiting, unbounded by default: creating or
    # editing 500 objects at once started 500, each holding its event's body and its handler's
    # state while it waited for a thread. The burst left 250-290 MiB behind (Python's arenas
    # keep what it fragmented); a few workers per thread, each freeing its slot a second after
    # its object's last event, held 500 objects at about 150 MiB with the same throughput
    # (bench/results/scale.md).
    settings.queueing.worker_limit = QUEUE_WORKERS_PER_THREAD * workers
    settings.queueing.idle_timeout = 1.0
    memo.services = edge.build(launch)
    port = launch.settings.metrics_port
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


@kopf.on.resume(models.GROUP, models.VERSION, models.PLURAL)
@kopf.on.create(models.GROUP, models.VERSION, models.PLURAL)
@kopf.on.update(models.GROUP, models.VERSION, models.PLURAL)
def reconcile_llm_deployment(
    body: kopf.Body, memo: kopf.Memo, logger: KopfLogger, retry: int, **_: Any
) -> None:
    """Creates or corrects the children; an unservable spec fails permanently until edited,
    a failure to apply is retried with back-off."""
    try:
        outcome = _services(memo).reconciler.run(dict(body), logger, routine=retry > 0)
    except NotDue as early:  # the resync retried it meanwhile: wait out its back-off
        raise kopf.TemporaryError(str(early), delay=early.remaining) from None
    except RetryLater as later:
        raise kopf.TemporaryError(str(later), delay=later.delay) from later.__cause__
    if outcome.invalid is not None:
        # Kopf keeps the message in an annotation: bounded, the whole text is in the status.
        raise kopf.PermanentError(clip(f"Invalid spec: {outcome.invalid}", ERROR_LIMIT))


@kopf.on.startup()
async def start_resync(memo: kopf.Memo, **_: Any) -> None:
    """Starts the periodic level-based pass over every LLMDeployment (see the module's
    docstring for why it is not a Kopf timer)."""
    _services(memo).resync.start()


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    services: edge.Services | None = memo.get("services")
    if services is not None:
        services.resync.stop()


@kopf.on.event(models.GROUP, models.VERSION, models.PLURAL)
def on_llm_deployment_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A deleted LLMDeployment's metrics, back-off and cached children go with it, and its
    children's events are not its business any more."""
    if event.get("type") == "DELETED":
        _services(memo).reconciler.deleted(event["object"]["metadata"])


_CHILD_LABELS = {render.LABEL_MANAGED_BY: render.MANAGED_BY}


@kopf.on.event("apps/v1", "deployments", labels=_CHILD_LABELS)
@kopf.on.event("v1", "services", labels=_CHILD_LABELS)
@kopf.on.event("v1", "pods", labels=_CHILD_LABELS)
@kopf.on.event("batch/v1", "jobs", labels=_CHILD_LABELS)
def on_child_event(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: KopfLogger, **_: Any
) -> None:
    """A child changed, was edited by hand or deleted: reconcile its LLMDeployment."""
    child = dict(event.get("object") or {})
    _services(memo).reconciler.child_event(event.get("type"), child, logger)


# Kopf logs each event handler's success at INFO: a line per watch event of every child and
# LLMDeployment, most of the log at scale, saying nothing. What they do that matters (an event
# posted, a status written) is logged by the reconciler (`slotune.edge.reconciler`).
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
    starts. What it was started with reaches the startup handlers in Kopf's memo."""
    launch = edge.Launch.from_env(namespaces, kubeconfig, clock)
    if kubeconfig is not None:
        os.environ["KUBECONFIG"] = kubeconfig  # Kopf's own login reads it
    kopf.configure(verbose=False, log_prefix=True)  # every object's line names it
    logging.getLogger("kopf.objects").addFilter(_quiet_watch_handlers)
    with leading(launch.settings, liveness_endpoint, lambda: edge.new_kube(launch)):
        kopf.run(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness_endpoint,
            memo=kopf.Memo(launch=launch),
        )
