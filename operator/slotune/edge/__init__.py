"""The services behind the Kopf edge (`slotune.handlers`), which only adapts Kopf to them:

- `reconciler`: one object's pass (its lock, back-off and study steps) and what a child's
  event or an object's deletion means for it;
- `seen`: the body last seen of each object, and the objects deleted lately;
- `resync`: the periodic pass over every object;
- `memory`: giving freed heap back to the system;
- `leadership`: holding the leader's Lease while the operator runs.

`Launch` is what the operator was started with; `build` makes the `Services` from it once,
when the operator starts, and the edge hands them to every handler through Kopf's `memo`.
None of them imports Kopf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime

from slotune import opmetrics, study
from slotune.edge.reconciler import Clock, Reconciler
from slotune.edge.resync import Resync
from slotune.edge.seen import LastSeen
from slotune.kube import CachedKube, RateLimit, load_api_client
from slotune.monitor import PrometheusMonitor
from slotune.reconcile import Monitor
from slotune.settings import OperatorSettings


def _now() -> datetime:
    return datetime.now(UTC)


@dataclasses.dataclass(frozen=True)
class Launch:
    """What `slotune operator` was started with; the defaults are a bare `kopf run`'s."""

    settings: OperatorSettings = dataclasses.field(default_factory=OperatorSettings)
    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()
    monitor: Monitor | None = None
    clock: Clock = _now

    @classmethod
    def from_env(
        cls, namespaces: Sequence[str], kubeconfig: str | None, clock: Clock | None = None
    ) -> Launch:
        """The operator's settings from the environment (`slotune.settings`: one it cannot
        use raises SettingsError), with what its command line says."""
        settings = OperatorSettings.from_env()
        return cls(
            settings=settings,
            kubeconfig=kubeconfig,
            namespaces=tuple(namespaces),
            monitor=PrometheusMonitor(default_url=settings.prometheus_url),
            clock=clock or _now,
        )


@dataclasses.dataclass(frozen=True)
class Services:
    """The operator's services, one of each for the process."""

    kube: CachedKube
    seen: LastSeen
    reconciler: Reconciler
    resync: Resync


def new_kube(launch: Launch) -> CachedKube:
    """A client for the operator's own calls: a connection for each thread that may call (the
    handlers' and the resync's, plus a few), under the client-side rate limit, with the
    serving children cached from the watches."""
    settings = launch.settings
    return CachedKube(
        load_api_client(launch.kubeconfig, connections=2 * settings.workers + 4),
        rate_limit=RateLimit(settings.kube_qps, settings.kube_burst),
        on_request=opmetrics.record_request,
    )


def build(launch: Launch, kube: CachedKube | None = None) -> Services:
    """The services of an operator started with `launch`, on `kube` (by default a client of
    its own, `new_kube`)."""
    settings = launch.settings
    kube = kube if kube is not None else new_kube(launch)
    seen = LastSeen()
    trial_settings = study.Settings(
        load_image=settings.load_image, startup_seconds=settings.trial_startup_seconds
    )
    reconciler = Reconciler(
        kube, seen=seen, trial_settings=trial_settings, clock=launch.clock, monitor=launch.monitor
    )
    resync = Resync(
        reconciler,
        kube,
        namespaces=launch.namespaces,
        period=settings.resync_seconds,
        workers=settings.workers,
    )
    return Services(kube=kube, seen=seen, reconciler=reconciler, resync=resync)
