"""The operator's own settings: every environment variable of slotune's, read in one place,
once, when the operator starts.

The chart sets them on the operator's pod (`values.yaml`, `extraEnv`); a local `slotune
operator` reads the shell's. A value that cannot be used stops the operator at start-up with
an error naming the variable and what it takes, rather than later in some handler. (The
Kubernetes client's own in-cluster variables, `KUBERNETES_SERVICE_*`, are the client's, read
by `slotune.kube`.)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

RESYNC_SECONDS = "SLOTUNE_RESYNC_SECONDS"
WORKERS = "SLOTUNE_WORKERS"
PROMETHEUS_URL = "SLOTUNE_PROMETHEUS_URL"
METRICS_PORT = "SLOTUNE_METRICS_PORT"
IMAGE = "SLOTUNE_IMAGE"
TRIAL_STARTUP_SECONDS = "SLOTUNE_TRIAL_STARTUP_SECONDS"
LEADER_ELECTION = "SLOTUNE_LEADER_ELECTION"
POD_NAME = "SLOTUNE_POD_NAME"
KUBE_QPS = "SLOTUNE_KUBE_QPS"
KUBE_BURST = "SLOTUNE_KUBE_BURST"


class SettingsError(ValueError):
    """An environment variable of the operator's holds something it cannot use."""


@dataclass(frozen=True)
class OperatorSettings:
    """What the operator's environment sets, with the defaults of a bare `slotune operator`."""

    resync_seconds: float = 30.0
    """How often every LLMDeployment is reconciled even when nothing changed."""
    workers: int = 16
    """Handler threads (and the resync's pool): enough that a slow object delays no other."""
    prometheus_url: str | None = None
    """The Prometheus of LLMDeployments that name none in spec.monitoring."""
    metrics_port: int | None = None
    """Where the operator serves its own metrics; None: nowhere (the chart sets 8080)."""
    load_image: str = "slotune/operator:latest"
    """The image of the trial load Jobs (the chart sets the operator's own)."""
    trial_startup_seconds: float = 960.0
    """A trial engine not ready by then has failed."""
    leader_lease: tuple[str, str] | None = None
    """The Lease (namespace, name) replicas elect a leader on; None: no election, this
    process acts alone (a local `slotune operator`). The chart always sets one."""
    identity: str = ""
    """This replica's name in the Lease: the pod's name (the chart passes it); empty, the
    host's name and the process id."""
    kube_qps: float = 100.0
    """Client-side limit on the operator's requests to the API server, per second...
    An edit to all 500 objects of bench/scale.py costs 4.5 requests each (Kopf's among them):
    at 50/s (bursts of 100) it converged in 30-35 s, at 100/s (bursts of 200) in 19-20 s, with
    no 429 either way (the requests in flight at once are bounded by the threads, not by this)."""
    kube_burst: int = 200
    """... and at once."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if environ is None else environ
        defaults = cls()
        return cls(
            resync_seconds=_read(env, RESYNC_SECONDS, defaults.resync_seconds, _seconds),
            workers=_read(env, WORKERS, defaults.workers, _threads),
            prometheus_url=env.get(PROMETHEUS_URL, "").strip() or None,
            metrics_port=_read(env, METRICS_PORT, defaults.metrics_port, _port),
            load_image=env.get(IMAGE, "").strip() or defaults.load_image,
            trial_startup_seconds=_read(
                env, TRIAL_STARTUP_SECONDS, defaults.trial_startup_seconds, _seconds
            ),
            leader_lease=_read(env, LEADER_ELECTION, defaults.leader_lease, _lease),
            identity=env.get(POD_NAME, "").strip(),
            kube_qps=_read(env, KUBE_QPS, defaults.kube_qps, _rate),
            kube_burst=_read(env, KUBE_BURST, defaults.kube_burst, _requests),
        )


def _read(env: Mapping[str, str], name: str, default: T, parse: Callable[[str], T]) -> T:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError as error:
        raise SettingsError(f"{name}={raw!r}: {error}") from None


def _positive(unit: str) -> Callable[[str], float]:
    """A parser of numbers above 0, e.g. of "seconds"."""

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not value > 0:
            raise ValueError(f"must be a number of {unit} above 0")
        return value

    return parse


def _at_least_one(unit: str) -> Callable[[str], int]:
    """A parser of whole numbers of 1 or more, e.g. of "threads"."""

    def parse(raw: str) -> int:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"must be a whole number of {unit}, at least 1")
        return int(raw)

    return parse


_seconds = _positive("seconds")
_rate = _positive("requests per second")
_threads = _at_least_one("threads")
_requests = _at_least_one("requests")


def _port(raw: str) -> int | None:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError("is not a TCP port (1-65535)")
    return int(raw)


_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _lease(raw: str) -> tuple[str, str]:
    namespace, _, name = raw.partition("/")
    if not _NAME.fullmatch(namespace) or not _NAME.fullmatch(name):
        raise ValueError("must name a Lease as namespace/name, e.g. slotune-system/slotune")
    return namespace, name
