"""The operator's side of leader election (`slotune.leader`): wait for the Lease before
acting, renew it while acting, give it back on the way out, and stop at once if it was lost."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator

from slotune.kube import Kube
from slotune.leader import LeaderElector, standby_health
from slotune.settings import OperatorSettings

log = logging.getLogger(__name__)


@contextlib.contextmanager
def leading(
    settings: OperatorSettings, liveness_endpoint: str | None, new_kube: Callable[[], Kube]
) -> Iterator[None]:
    """With leader election on, waits until this replica holds the Lease (answering its
    liveness probe meanwhile: a standby is healthy), keeps it in a thread of its own while
    the body runs, and releases it after. With it off, only runs the body."""
    elector = _lead(settings, liveness_endpoint, new_kube)
    stop = threading.Event()
    if elector is not None:
        threading.Thread(
            target=hold, args=(elector, stop), name="slotune lease", daemon=True
        ).start()
    try:
        yield
    finally:
        stop.set()
        if elector is not None:
            elector.release()


def _lead(
    settings: OperatorSettings, liveness_endpoint: str | None, new_kube: Callable[[], Kube]
) -> LeaderElector | None:
    if settings.leader_lease is None:
        return None
    namespace, name = settings.leader_lease
    identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(new_kube(), namespace, name, identity)
    with standby_health(liveness_endpoint):
        elector.acquire()
    return elector


def _exit() -> None:
    log.critical("Exiting: this replica is no longer the leader")
    logging.shutdown()
    os._exit(1)


def hold(
    elector: LeaderElector, stop: threading.Event, on_lost: Callable[[], None] = _exit
) -> None:
    """Renews the Lease; a leader that could not must stop acting before another replica
    takes over, so the process ends at once (its pod restarts as a standby)."""
    elector.keep(stop)
    if not stop.is_set():
        on_lost()
