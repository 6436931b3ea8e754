"""On-call monitoring for the reconciler: reads Prometheus, decides with `oncall`, and hands
the study what it needs (hold, throttling, a due re-tune, the live SLO verdict, the shape of
live traffic).

Readings are cached for a few seconds per LLMDeployment, so a study taking several steps in
a row, or a burst of child events, costs Prometheus one round of queries.

A Prometheus that hangs or fails must not slow the operator: each URL has a circuit breaker.
After a failed read, the URL's readings are "unavailable" at once, without a request, for a
cool-down (5 s, doubling up to a minute while it keeps failing); then one read probes it while
the others still skip it. So a sick Prometheus costs one timeout per cool-down, not one per
reconcile, and objects that do not use it never wait on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from slotune.backoff import Backoff
from slotune.engine import engine_for
from slotune.live import oncall
from slotune.metrics import PrometheusSource, model_selector, names_for, peak_arrival_rate
from slotune.models import LLMDeploymentSpec, LLMDeploymentStatus, WorkloadSpec
from slotune.reconcile import Watch
from slotune.study import Live

CACHE_SECONDS = 5.0
QUERY_TIMEOUT_SECONDS = 5
COOL_DOWN_SECONDS = 5.0
COOL_DOWN_CAP_SECONDS = 60.0


class Breaker:
    """The circuit breaker of one Prometheus URL: its cool-downs are a `Backoff` (without
    jitter) of the URL's consecutive failures. Thread-safe; `clock` for tests."""

    def __init__(
        self,
        cool_down: float = COOL_DOWN_SECONDS,
        cap: float = COOL_DOWN_CAP_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cool_down = Backoff(cool_down, cap, clock=clock, jitter=lambda: 0.0)
        self._lock = threading.Lock()
        self._probing = False
        self.last_error: str | None = None  # why it opened, for the readings it skips

    def allow(self) -> bool:
        """Whether to send a read now: always while closed; once open, only the one probe
        after the cool-down (the caller must then report `succeeded` or `failed`)."""
        with self._lock:
            if self._cool_down.failures(self) == 0:
                return True
            if self._probing or not self._cool_down.due(self):
                return False
            self._probing = True
            return True

    def succeeded(self) -> None:
        with self._lock:
            self._cool_down.succeeded(self)
            self._probing, self.last_error = False, None

    def failed(self, error: str) -> None:
        with self._lock:
            self._cool_down.failed(self)
            self._probing, self.last_error = False, error

    def released(self) -> None:
        """A probe that ended without a verdict (an unexpected error) frees the slot."""
        with self._lock:
            self._probing = False


@dataclass
class _Cached:
    at: float
    reading: oncall.LiveReading
    workload: WorkloadSpec | None
    demand: float | None = None


class PrometheusMonitor:
    """The `reconcile.Monitor` the operator runs with."""

    def __init__(
        self,
        default_url: str | None = None,
        cache_seconds: float = CACHE_SECONDS,
        timeout: int = QUERY_TIMEOUT_SECONDS,
    ) -> None:
        self.default_url = default_url  # for LLMDeployments that name no Prometheus
        self.cache_seconds = cache_seconds
        self.timeout = timeout
        self._sources: dict[str, PrometheusSource] = {}
        self._cache: dict[tuple[str, str, str], _Cached] = {}
        self._breakers: dict[str, Breaker] = {}
        self._lock = threading.Lock()

    def _source(self, url: str) -> tuple[PrometheusSource, Breaker]:
        with self._lock:
            if url not in self._sources:
                self._sources[url] = PrometheusSource(url, timeout=self.timeout)
                self._breakers[url] = Breaker()
            return self._sources[url], self._breakers[url]

    def _read(
        self,
        url: str,
        spec: LLMDeploymentSpec,
        namespace: str,
        served: str,
        now: datetime,
        *,
        trial_pods: list[str],
    ) -> _Cached:
        key = (url, namespace, served)
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached.at < self.cache_seconds:
            return cached
        source, breaker = self._source(url)
        if not breaker.allow():
            # Skipped: the same verdict as the read that opened the breaker, at no cost.
            skipped = oncall.LiveReading(
                at=now,
                url=source.url,
                namespace=namespace,
                model=served,
                window=spec.slo.window if spec.slo else oncall.DEFAULT_WINDOW,
                available=False,
                error=breaker.last_error,
                unreachable=True,
            )
            return _Cached(time.monotonic(), skipped, None)
        try:
            reading = oncall.read_live(
                source,
                spec,
                namespace=namespace,
                served_name=served,
                now=now,
                trial_pods=trial_pods,
            )
        except BaseException:
            breaker.released()
            raise
        if reading.unreachable:
            breaker.failed(
                f"Prometheus at {source.url} is not answering ({reading.cause or 'failed'}); "
                "it is asked again after a cool-down"
            )
        else:
            breaker.succeeded()
        workload = None
        if reading.available and spec.tuning.enabled and spec.tuning.workload.source == "Live":
            workload = live_workload(source, spec, namespace, served)
        demand = None
        if reading.available and spec.scaling.mode != "Fixed":
            demand = peak_demand(source, spec, namespace, served)
        cached = _Cached(time.monotonic(), reading, workload, demand)
        self._cache[key] = cached
        return cached

    def __call__(
        self,
        spec: LLMDeploymentSpec,
        previous: LLMDeploymentStatus,
        namespace: str,
        served: str,
        now: datetime,
    ) -> Watch | None:
        url = oncall.prometheus_url(spec, self.default_url)
        tuning = previous.tuning
        # A canary's GPUs count too: a trial measured on a throttled GPU is not trusted.
        trial_pods = (
            [tuning.current.pod] if tuning and tuning.current and tuning.current.pod else []
        )
        cached = (
            self._read(url, spec, namespace, served, now, trial_pods=trial_pods) if url else None
        )
        reading = cached.reading if cached else None
        decided = oncall.evaluate(
            spec,
            previous,
            reading,
            now,
            last_study_started=tuning.started_at if tuning else None,
        )
        slo_row = next((r for r in decided.conditions if r[0] == "SLOMet"), None)
        live = Live(
            hold=decided.hold,
            throttled=decided.throttled,
            retune=decided.retune,
            slo_met=decided.slo.met if decided.slo else None,
            slo_measured_at=decided.slo.measured_at if decided.slo else None,
            slo_detail=slo_row[3] if slo_row else "",
            workload=cached.workload if cached else None,
        )
        return Watch(
            live=live,
            rows=decided.conditions,
            slo=decided.slo,
            gpu=decided.gpu,
            demand=cached.demand if cached else None,
        )


def peak_demand(
    source: PrometheusSource, spec: LLMDeploymentSpec, namespace: str, served: str
) -> float | None:
    """The peak arrival rate over the stabilization window (0 when the engines were scraped
    and nothing arrived); None when Prometheus cannot tell."""
    engine = engine_for(spec.engine.kind)
    selector = model_selector(model_name=served, namespace=namespace, label=engine.model_label)
    query = peak_arrival_rate(
        spec.scaling.stabilization_window, selector, names=names_for(engine.metrics)
    )
    try:
        value = source.query_value(query)
    except Exception:  # noqa: BLE001 - Prometheus trouble is reported by the SLO reading
        return None
    return max(value, 0.0) if value is not None else None


def live_workload(
    source: PrometheusSource, spec: LLMDeploymentSpec, namespace: str, served: str
) -> WorkloadSpec | None:
    """The trial workload shaped like live traffic over the SLO window: its arrival rate and
    mean prompt and output lengths. None until there has been traffic to copy."""
    window = spec.slo.window if spec.slo else "5m"
    engine = engine_for(spec.engine.kind)
    try:
        fingerprint = source.workload_fingerprint(
            window,
            model_selector(model_name=served, namespace=namespace, label=engine.model_label),
            names=names_for(engine.metrics),
        )
    except Exception:  # noqa: BLE001 - Prometheus trouble is reported by the SLO reading
        return None
    rate, prompt, output = (
        fingerprint.arrival_rate,
        fingerprint.prompt_mean,
        fingerprint.output_mean,
    )
    if not rate or not prompt or not output:
        return None
    configured = spec.tuning.workload
    return WorkloadSpec.model_validate(
        {
            "source": "Synthetic",
            "promptTokens": {"mean": max(round(prompt), 1), "spread": 0.25},
            "outputTokens": {"mean": max(round(output), 1), "spread": 0.25},
            "requestRate": round(rate, 3),
            "sharedPrefixRatio": configured.shared_prefix_ratio,
            "duration": configured.duration,
        }
    )
