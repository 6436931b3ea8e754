"""The services behind the Kopf edge, without Kopf running: the startup handler puts them in
the memo every handler gets; one object's pass backs off after a failure; the resync passes
over every object but those backing off, whatever one of them raises; a leader that lost its
Lease stops; the deleted owners are remembered within a bound."""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from pathlib import Path
from typing import Any

import kopf
import pytest

from slotune import edge, handlers
from slotune.edge.leadership import hold, leading
from slotune.edge.reconciler import NotDue, RetryLater
from slotune.edge.resync import Resync
from slotune.edge.seen import LastSeen
from slotune.kube import KubeError
from slotune.settings import OperatorSettings

log = logging.getLogger(__name__)

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_startup_handler_puts_the_services_in_every_objects_memo(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    launch = edge.Launch(settings=OperatorSettings(workers=3), kubeconfig=str(kubeconfig))
    memo = kopf.Memo(launch=launch)
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings, memo=memo, logger=log)
    assert isinstance(memo.services, edge.Services)
    assert settings.execution.max_workers == 3
    assert settings.queueing.worker_limit == 3 * handlers.QUEUE_WORKERS_PER_THREAD
    # Kopf gives each object a shallow copy of the operator's memo: the same services.
    assert copy.copy(memo).services.reconciler is memo.services.reconciler


class FailingKube:
    """An API server that answers every read with a 503."""

    def __init__(self) -> None:
        self.reads = 0
        self.forgotten: list[tuple[str, str]] = []

    def get(self, ref: object) -> None:
        self.reads += 1
        raise KubeError(503, "ServiceUnavailable", "try later")

    def forget(self, namespace: str, name: str) -> None:
        self.forgotten.append((namespace, name))


def test_a_failed_pass_backs_off_routine_passes_until_it_is_deleted() -> None:
    kube = FailingKube()
    reconciler = edge.build(edge.Launch(), kube=kube).reconciler  # type: ignore[arg-type]
    body = {"metadata": {"namespace": "prod", "name": "chat", "uid": "u1"}}
    with pytest.raises(RetryLater, match="Kubernetes API call failed: 503") as failed:
        reconciler.run(body, log)
    assert 10 <= failed.value.delay <= 11
    with pytest.raises(NotDue):
        reconciler.run(body, log, routine=True)  # the resync, a child's event, Kopf's retry
    assert not reconciler.due(("prod", "chat"))
    with pytest.raises(RetryLater):
        reconciler.run(body, log)  # a create, resume or spec edit is tried at once
    assert kube.reads == 2
    reconciler.deleted(body["metadata"])
    assert reconciler.due(("prod", "chat"))
    assert reconciler.seen.is_gone("u1")
    assert kube.forgotten == [("prod", "chat")]


class Listing:
    def __init__(self, objects: dict[str, list[str]]) -> None:
        self.objects = objects

    def list_llm_deployments(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return [{"metadata": {"namespace": namespace, "name": n}} for n in self.objects[namespace]]


class Passes:
    """A reconciler that records its passes: `broken` raises, `waiting` backs off."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, bool, bool]] = []

    def due(self, key: tuple[str, str]) -> bool:
        return key[1] != "waiting"

    def run(self, body: dict[str, Any], logger: Any, *, routine: bool, delivered: bool) -> None:
        self.runs.append((body["metadata"]["name"], routine, delivered))
        if body["metadata"]["name"] == "broken":
            raise ValueError("a bug")
        if body["metadata"]["name"] == "failing":
            raise RetryLater("could not apply", 10)


def test_the_resync_passes_over_each_watched_namespace_but_what_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    passes = Passes()
    trimmed: list[None] = []
    kube = Listing({"a": ["broken", "waiting"], "b": ["failing", "chat"], "c": ["other"]})
    resync = Resync(
        passes,  # type: ignore[arg-type]
        kube,  # type: ignore[arg-type]
        namespaces=["a", "b"],
        period=0.05,
        workers=2,
        trim=lambda: trimmed.append(None),
    )

    logged = ("Resync of a/broken failed", "Resync of b/failing failed: could not apply")

    async def one_pass() -> None:
        resync.start()
        for _ in range(200):  # at most 10 s on a busy machine
            if len(passes.runs) >= 3 and all(line in caplog.text for line in logged):
                break
            await asyncio.sleep(0.05)
        resync.stop()
        with pytest.raises(asyncio.CancelledError):
            await resync.task  # type: ignore[misc]

    asyncio.run(one_pass())
    names = [name for name, *_ in passes.runs]
    # Each in a thread of its own: in any order, and the one that raised stops no other.
    assert set(names[:3]) == {"broken", "failing", "chat"}
    assert "waiting" not in names  # backing off
    assert "other" not in names  # not a watched namespace
    assert all(run[1:] == (True, True) for run in passes.runs)  # routine, from the listing
    assert trimmed
    assert all(line in caplog.text for line in logged)


class Elector:
    def __init__(self) -> None:
        self.released = False

    def keep(self, stop: threading.Event) -> None:
        pass  # renewal failed for the renew deadline

    def release(self) -> None:
        self.released = True


def test_a_leader_that_lost_its_lease_stops_and_one_told_to_stop_does_not() -> None:
    lost: list[None] = []
    stop = threading.Event()
    hold(Elector(), stop, lambda: lost.append(None))  # type: ignore[arg-type]
    assert lost == [None]
    stop.set()
    hold(Elector(), stop, lambda: lost.append(None))  # type: ignore[arg-type]
    assert lost == [None]


def test_without_leader_election_no_lease_is_read() -> None:
    def new_kube() -> Any:
        raise AssertionError("no election, no client")

    ran = False
    with leading(OperatorSettings(leader_lease=None), None, new_kube):
        ran = True
    assert ran


def test_the_deleted_owners_are_kept_within_their_bound() -> None:
    seen = LastSeen(gone_kept=2)
    for uid in ("u1", "u2", "u3"):
        seen.deleted(uid)
    assert not seen.is_gone("u1")
    assert seen.is_gone("u2")
    assert seen.is_gone("u3")
    assert not seen.is_gone(None)
