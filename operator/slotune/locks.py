"""One lock per key (an object's namespace and name), kept only while a thread holds it or
waits for it. A table of locks that only grows keeps one for every object ever reconciled,
deleted ones included: a deleted object's children, which the garbage collector removes after
it, each trigger a pass on their owner's name and would create its lock again after the
owner's DELETED event had dropped it. Pure logic."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0  # threads holding or waiting for `lock`


class KeyedLocks:
    """`with locks.hold(key):` runs one thread at a time for each key."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}

    @contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._guard:
                entry.users -= 1
                if entry.users == 0:
                    del self._entries[key]

    def __len__(self) -> int:
        """Keys held or waited for now."""
        with self._guard:
            return len(self._entries)
