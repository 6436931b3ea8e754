"""The periodic level-based pass over every LLMDeployment, a task of slotune's own rather
than a Kopf timer: Kopf holds a finalizer on every object that has a timer (see
`slotune.handlers`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slotune.edge.memory import trim_heap
from slotune.edge.reconciler import NotDue, Reconciler, RetryLater
from slotune.edge.seen import Key
from slotune.kube import Kube, KubeError

log = logging.getLogger(__name__)


class Resync:
    """Every `period` seconds, each LLMDeployment (of `namespaces`, or all) is reconciled
    once more (refreshing status and repairing what the watches missed), in a pool of
    `workers` threads of its own; an object whose last pass is still running (a study step
    that launches a trial, say) is left to finish it, one backing off is left to wait."""

    def __init__(
        self,
        reconciler: Reconciler,
        kube: Kube,
        *,
        namespaces: Sequence[str] = (),
        period: float,
        workers: int,
        trim: Callable[[], None] = trim_heap,
    ) -> None:
        self.reconciler, self.kube, self.namespaces = reconciler, kube, list(namespaces)
        self.period, self.workers, self.trim = period, workers, trim
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Starts the passes on the running event loop."""
        self.task = asyncio.create_task(self.forever(), name="slotune resync")

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def forever(self) -> None:
        """The objects of one pass are spread evenly over the period rather than started at
        once: 500 reconciles queued together on 16 threads each waited on the others for the
        interpreter, which stretched a reconcile of a few milliseconds to most of a second."""
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="resync")
        running: set[Key] = set()
        await asyncio.sleep(self.period)
        while True:
            started = loop.time()
            await loop.run_in_executor(pool, self.trim)  # what the last period freed
            try:
                listed = await loop.run_in_executor(pool, self.listed)
            except KubeError as exc:
                log.warning("Could not list the LLMDeployments to resync: %s", exc)
                listed = []
            gap = self.period / max(len(listed), 1)
            for index, body in enumerate(listed):
                await asyncio.sleep(max(0.0, started + index * gap - loop.time()))
                key = (body["metadata"]["namespace"], body["metadata"]["name"])
                if key in running or not self.reconciler.due(key):
                    continue  # still running its last pass, or backing off after failures
                running.add(key)
                future = loop.run_in_executor(pool, self.resync, body)
                future.add_done_callback(functools.partial(_done, running, key))
            await asyncio.sleep(max(0.0, started + self.period - loop.time()))

    def listed(self) -> list[dict[str, Any]]:
        if not self.namespaces:
            return self.kube.list_llm_deployments()
        return [obj for ns in self.namespaces for obj in self.kube.list_llm_deployments(ns)]

    def resync(self, body: dict[str, Any]) -> None:
        """One object's pass from its listed body; a failure is logged, never raised."""
        meta = body["metadata"]
        # Kopf's formatter prefixes `[namespace/name]` to a record carrying k8s_ref.
        ref = {k: meta[k] for k in ("namespace", "name")}
        logger = logging.LoggerAdapter(log, {"k8s_ref": ref})
        try:
            self.reconciler.run(body, logger, routine=True, delivered=True)
        except NotDue:  # Kopf's retry ran it meanwhile
            pass
        except RetryLater as exc:  # the next pass tries again
            logger.warning("Resync of %s/%s failed: %s", meta["namespace"], meta["name"], exc)
        except Exception:  # one object's bug must not end the resync of every other
            logger.exception("Resync of %s/%s failed", meta["namespace"], meta["name"])


def _done(running: set[Key], key: Key, _: object) -> None:
    running.discard(key)
