"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it,
so that the chart can run several operator replicas of which exactly one acts.

- A candidate takes the Lease when it is free: absent, released (no holder), or not renewed
  for `lease_seconds` as this candidate's own clock measures it (the time since it last saw
  the Lease change, never the holder's timestamps, so clock skew between nodes does not
  matter). Every write carries the resourceVersion it read: of two candidates racing, the
  API server lets one win and answers the other 409.
- The leader renews every `retry_seconds`. If it could not renew for `renew_seconds`
  (< `lease_seconds`), it stops acting (the operator exits and its pod restarts as a
  candidate) before any other candidate can take the Lease: the gap between the two is
  what keeps two leaders from overlapping.
- A leader that shuts down cleanly releases the Lease, so a standby takes over within
  `retry_seconds`; one that dies holding it is replaced within `lease_seconds +
  retry_seconds`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from slotune.kube import Kube, KubeError, Ref

log = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
RENEW_SECONDS = 10.0
RETRY_SECONDS = 2.0


def _micro_time(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Timing:
    lease_seconds: float = LEASE_SECONDS
    renew_seconds: float = RENEW_SECONDS
    retry_seconds: float = RETRY_SECONDS

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_seconds < self.lease_seconds:
            raise ValueError(
                "leader election needs 0 < retry < renew deadline < lease duration, not "
                f"{self.retry_seconds}, {self.renew_seconds}, {self.lease_seconds}"
            )

    @property
    def takeover_bound(self) -> float:
        """The longest a standby waits after the leader died without releasing."""
        return self.lease_seconds + self.retry_seconds


class LeaderElector:
    """One candidate for one Lease."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.kube = kube
        self.ref = Ref("coordination.k8s.io/v1", "Lease", namespace, name)
        self.identity = identity
        self.timing = timing or Timing()
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self._seen: tuple[Any, ...] | None = None  # the Lease's record as last read
        self._seen_at = 0.0  # when it last changed, by our clock
        self._renewed_at = 0.0  # our last successful acquire or renew
        self.holder: str | None = None  # who held it at the last read

    def _lease(self, spec: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.ref.name, "namespace": self.ref.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": self.ref.api_version,
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards."""
        now, wall = self._clock(), _micro_time(self._wall())
        mine = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.timing.lease_seconds),
            "acquireTime": wall,
            "renewTime": wall,
            "leaseTransitions": 0,
        }
        try:
            current = self.kube.get(self.ref)
            if current is None:
                self.kube.create(self._lease(mine, None))
                self.holder, self._renewed_at = self.identity, now
                return True
            spec = current.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
            if record != self._seen:
                self._seen, self._seen_at = record, now
            self.holder = holder or None
            held = holder and holder != self.identity
            if held and now - self._seen_at < self.timing.lease_seconds:
                return False  # held, and renewed within the lease as we measure it
            if holder == self.identity:
                mine["acquireTime"] = spec.get("acquireTime") or wall
                mine["leaseTransitions"] = spec.get("leaseTransitions") or 0
            else:
                mine["leaseTransitions"] = (spec.get("leaseTransitions") or 0) + 1
            self.kube.replace(self._lease(mine, current["metadata"]["resourceVersion"]))
        except KubeError as exc:
            if exc.status != 409:
                log.warning("Could not read or write the Lease %s: %s", self.ref.name, exc)
            return False
        self.holder, self._renewed_at = self.identity, now
        return True

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Waits until this candidate leads (True), or `stop` is set (False)."""
        announced = None
        while stop is None or not stop.is_set():
            if self.try_acquire_or_renew():
                log.info("Leading: holds the Lease %s/%s", self.ref.namespace, self.ref.name)
                return True
            if self.holder != announced:
                announced = self.holder
                log.info(
                    "Standing by: the Lease %s/%s is held by %s",
                    self.ref.namespace,
                    self.ref.name,
                    self.holder,
                )
            self._sleep(self.timing.retry_seconds)
        return False

    def keep(self, stop: threading.Event) -> None:
        """Renews until `stop` is set (returns) or renewal fails for the renew deadline
        (returns too: the caller must stop acting at once)."""
        while not stop.wait(self.timing.retry_seconds):
            if self.try_acquire_or_renew():
                continue
            if self._clock() - self._renewed_at >= self.timing.renew_seconds:
                log.error(
                    "Lost the Lease %s/%s: not renewed for %.0f s (held by %s now)",
                    self.ref.namespace,
                    self.ref.name,
                    self._clock() - self._renewed_at,
                    self.holder,
                )
                return

    def release(self) -> None:
        """Gives the Lease up, if still held, so that a standby takes over at once."""
        try:
            current = self.kube.get(self.ref)
            if current is None or (current.get("spec") or {}).get("holderIdentity") != (
                self.identity
            ):
                return
            spec = dict(current["spec"], holderIdentity="", leaseDurationSeconds=1)
            self.kube.replace(self._lease(spec, current["metadata"]["resourceVersion"]))
            log.info("Released the Lease %s/%s", self.ref.namespace, self.ref.name)
        except KubeError as exc:
            log.warning("Could not release the Lease %s: %s", self.ref.name, exc)


@contextlib.contextmanager
def standby_health(endpoint: str | None) -> Iterator[None]:
    """Answers the liveness endpoint (`http://host:port/path`, as Kopf's `--liveness`) with
    200 while a standby waits for the Lease; Kopf's own endpoint replaces it once leading."""
    if endpoint is None:
        yield
        return
    url = urlsplit(endpoint)
    path = url.path or "/"

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?")[0] == path
            body = b'{"standby": true}' if ok else b"not found"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), Health)  # noqa: S104
    thread = threading.Thread(target=server.serve_forever, name="standby health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
