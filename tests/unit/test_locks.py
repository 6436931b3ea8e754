"""KeyedLocks: one thread at a time per key, and a table as large as the keys in use."""

from __future__ import annotations

import threading
import time

import pytest

from slotune.locks import KeyedLocks


def test_a_key_is_kept_while_held_and_dropped_after() -> None:
    locks = KeyedLocks()
    with locks.hold(("ns", "a")):
        assert len(locks) == 1
        with locks.hold(("ns", "b")):  # another key does not wait
            assert len(locks) == 2
    assert len(locks) == 0


def test_a_key_is_dropped_after_an_exception_too() -> None:
    locks = KeyedLocks()
    with pytest.raises(RuntimeError), locks.hold("a"):
        raise RuntimeError("the pass failed")
    assert len(locks) == 0


def test_one_thread_at_a_time_per_key_and_a_waiter_keeps_the_entry() -> None:
    locks = KeyedLocks()
    inside: list[str] = []
    overlap: list[tuple[str, ...]] = []
    first_in, release_first = threading.Event(), threading.Event()

    def first() -> None:
        with locks.hold("a"):
            inside.append("first")
            first_in.set()
            release_first.wait(5)
            overlap.append(tuple(inside))
            inside.remove("first")

    def second() -> None:
        with locks.hold("a"):
            inside.append("second")
            overlap.append(tuple(inside))
            inside.remove("second")

    one = threading.Thread(target=first)
    one.start()
    assert first_in.wait(5)
    two = threading.Thread(target=second)
    two.start()
    deadline = time.monotonic() + 5
    while locks._entries["a"].users < 2 and time.monotonic() < deadline:  # second is waiting
        time.sleep(0.01)
    assert locks._entries["a"].users == 2
    release_first.set()
    one.join(5)
    two.join(5)
    assert overlap == [("first",), ("second",)]  # never both inside
    assert len(locks) == 0


def test_many_deleted_objects_leave_nothing_behind() -> None:
    locks = KeyedLocks()
    for i in range(1000):  # a pass each on 1000 names, as after a bulk delete
        with locks.hold(("ns", f"o{i}")):
            pass
    assert len(locks) == 0
