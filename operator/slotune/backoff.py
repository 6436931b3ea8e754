"""Per-object retry back-off: an object whose reconcile keeps failing (a child the API server
will not take, a quota, a webhook that denies) is retried after 10 s, then 20, 40, ... up to
5 minutes, not every few seconds; one success starts it over. Pure logic, with a clock for
tests."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Hashable

BASE_SECONDS = 10.0
CAP_SECONDS = 300.0
JITTER = 0.1  # up to 10% later, so that objects that failed together do not retry together


class Backoff:
    """When each failing object may be tried again."""

    def __init__(
        self,
        base: float = BASE_SECONDS,
        cap: float = CAP_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.base, self.cap = base, cap
        self._clock, self._jitter = clock, jitter
        self._failures: dict[Hashable, tuple[int, float]] = {}  # key -> (failures, due at)
        self._lock = threading.Lock()

    def failed(self, key: Hashable) -> float:
        """Counts one more failure; returns the seconds to wait before the next try."""
        with self._lock:
            failures = self._failures.get(key, (0, 0.0))[0] + 1
            delay = min(self.cap, self.base * 2.0 ** (failures - 1)) * (1 + JITTER * self._jitter())
            self._failures[key] = (failures, self._clock() + delay)
            return delay

    def succeeded(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)

    forget = succeeded

    def remaining(self, key: Hashable) -> float:
        """Seconds until a routine retry (the periodic resync, Kopf's retry of a failed
        handler) may try the object again; 0 when it may now."""
        with self._lock:
            entry = self._failures.get(key)
        return 0.0 if entry is None else max(0.0, entry[1] - self._clock())

    def due(self, key: Hashable) -> bool:
        return self.remaining(key) == 0

    def failures(self, key: Hashable) -> int:
        with self._lock:
            return self._failures.get(key, (0, 0.0))[0]

    def __len__(self) -> int:
        return len(self._failures)
