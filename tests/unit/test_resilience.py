"""The operator's defences, as pure logic: per-object retry back-off, the client-side rate
limit on API calls, and the circuit breaker in front of each Prometheus."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from slotune import models
from slotune.backoff import Backoff
from slotune.kube import RateLimit
from slotune.monitor import Breaker, PrometheusMonitor
from support.hanging import HangingServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_backoff_doubles_to_its_cap_and_one_success_starts_over() -> None:
    clock = Clock()
    backoff = Backoff(base=10, cap=300, clock=clock, jitter=lambda: 0.0)
    delays = [backoff.failed("a") for _ in range(8)]
    assert delays == [10, 20, 40, 80, 160, 300, 300, 300]
    backoff.succeeded("a")
    assert backoff.failed("a") == 10


def test_backoff_is_per_object_and_due_only_after_its_delay() -> None:
    clock = Clock()
    backoff = Backoff(base=10, cap=300, clock=clock, jitter=lambda: 0.0)
    backoff.failed("a")
    backoff.failed("a")  # 20 s
    assert not backoff.due("a")
    assert backoff.due("b")  # another object is untouched
    clock.now += 19.9
    assert not backoff.due("a")
    clock.now += 0.2
    assert backoff.due("a")
    backoff.forget("a")
    assert len(backoff) == 0


def test_jitter_only_ever_delays_and_by_at_most_a_tenth() -> None:
    backoff = Backoff(base=10, cap=300, jitter=lambda: 1.0)
    assert backoff.failed("a") == pytest.approx(11.0)


def test_rate_limit_lets_a_burst_through_then_spaces_calls_at_its_rate() -> None:
    clock = Clock()
    limit = RateLimit(qps=10, burst=5, clock=clock, sleep=clock.sleep)
    waits = [limit.acquire() for _ in range(5)]
    assert waits == [0, 0, 0, 0, 0]
    start = clock.now
    for _ in range(20):
        limit.acquire()
    assert clock.now - start == pytest.approx(2.0)  # 20 more at 10/s


def test_rate_limit_refills_while_idle_but_never_beyond_the_burst() -> None:
    clock = Clock()
    limit = RateLimit(qps=10, burst=5, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        limit.acquire()
    clock.now += 60  # idle for a minute: 600 tokens' worth, capped at 5
    assert [limit.acquire() for _ in range(5)] == [0, 0, 0, 0, 0]
    assert limit.acquire() == pytest.approx(0.1)


def test_rate_limit_holds_across_threads() -> None:
    clock = Clock()
    waited: list[float] = []
    limit = RateLimit(qps=100, burst=1, clock=clock, sleep=waited.append)
    threads = [threading.Thread(target=limit.acquire) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # With the clock standing still, the n-th caller waits n/100 s: every token is reserved
    # exactly once, whatever the threads' order.
    assert sorted(waited) == pytest.approx([n / 100 for n in range(1, 50)])


def test_rate_limit_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="qps > 0"):
        RateLimit(qps=0, burst=1)


def test_breaker_opens_on_failure_and_lets_one_probe_through_after_the_cool_down() -> None:
    clock = Clock()
    breaker = Breaker(cool_down=5, cap=60, clock=clock)
    assert breaker.allow()
    breaker.failed("Prometheus at http://p failed a query: timed out")
    assert not breaker.allow()
    assert breaker.last_error == "Prometheus at http://p failed a query: timed out"
    clock.now += 5
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # everyone else waits for its verdict
    breaker.failed("timed out")
    clock.now += 5
    assert not breaker.allow()  # the second cool-down is 10 s
    clock.now += 5
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.allow()
    assert breaker.allow()
    assert breaker.last_error is None


def test_breaker_cool_down_is_capped() -> None:
    clock = Clock()
    breaker = Breaker(cool_down=5, cap=60, clock=clock)
    for _ in range(10):
        clock.now += 3600
        assert breaker.allow()
        breaker.failed("down")
    clock.now += 59.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow()


def test_a_probe_that_ends_without_a_verdict_frees_the_slot() -> None:
    clock = Clock()
    breaker = Breaker(cool_down=5, cap=60, clock=clock)
    breaker.failed("down")
    clock.now += 5
    assert breaker.allow()
    breaker.released()
    assert breaker.allow()


def test_a_hanging_prometheus_costs_one_timeout_not_one_per_object() -> None:
    server = HangingServer()
    try:
        monitor = PrometheusMonitor(default_url=server.url, timeout=1)
        spec = models.LLMDeploymentSpec.model_validate(
            {"model": {"name": "m"}, "slo": {"ttft": {"percentile": 95, "maxSeconds": 2}}}
        )
        now = datetime(2026, 1, 1, tzinfo=UTC)
        watches: list[Any] = []

        def read(i: int) -> None:
            watches.append(monitor(spec, models.LLMDeploymentStatus(), "ns", f"model-{i}", now))

        def wave(first: int) -> float:
            started = time.monotonic()
            threads = [threading.Thread(target=read, args=(first + i,)) for i in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return time.monotonic() - started

        # The first wave finds the breaker closed: each of the 16 waits out the 1 s timeout,
        # side by side. Every later wave, within the cool-down, sends nothing and waits on
        # nothing.
        assert wave(0) < 3
        first_wave = server.accepted
        assert wave(100) < 0.5
        assert wave(200) < 0.5
        assert server.accepted == first_wave
        rows = [next(r for r in w.rows if r[0] == "MetricsAvailable") for w in watches]
        assert [r[1] for r in rows] == ["False"] * 48
        skipped = {r[3] for r in rows[16:]}
        assert len(skipped) == 1, "every skipped object says the same, stable thing"
        assert f"Prometheus at {server.url} is not answering" in skipped.pop()
    finally:
        server.close()
