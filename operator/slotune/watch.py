"""On-call monitoring for the reconciler: reads Prometheus, decides with `oncall`, and hands
the study what it needs (hold, throttling, a due re-tune, the live SLO verdict, the shape of
live traffic).

Readings are cached for a few seconds per LLMDeployment, so a study taking several steps in
a row, or a burst of child events, costs Prometheus one round of queries.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime

from slotune import oncall
from slotune.metrics import PrometheusSource, vllm_selector
from slotune.models import LLMDeploymentSpec, LLMDeploymentStatus, WorkloadSpec
from slotune.reconcile import Watch
from slotune.tuning import Live

CACHE_SECONDS = 5.0


@dataclass
class _Cached:
    at: float
    reading: oncall.LiveReading
    workload: WorkloadSpec | None


class PrometheusMonitor:
    """The `reconcile.Monitor` the operator runs with."""

    def __init__(
        self, default_url: str | None = None, cache_seconds: float = CACHE_SECONDS
    ) -> None:
        self.default_url = default_url  # for LLMDeployments that name no Prometheus
        self.cache_seconds = cache_seconds
        self._sources: dict[str, PrometheusSource] = {}
        self._cache: dict[tuple[str, str, str], _Cached] = {}
        self._lock = threading.Lock()

    def _source(self, url: str) -> PrometheusSource:
        with self._lock:
            if url not in self._sources:
                self._sources[url] = PrometheusSource(url, timeout=5)
            return self._sources[url]

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
        source = self._source(url)
        reading = oncall.read_live(
            source, spec, namespace=namespace, served_name=served, now=now, trial_pods=trial_pods
        )
        workload = None
        if reading.available and spec.tuning.enabled and spec.tuning.workload.source == "Live":
            workload = live_workload(source, spec, namespace, served)
        cached = _Cached(time.monotonic(), reading, workload)
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
        return Watch(live=live, rows=decided.conditions, slo=decided.slo, gpu=decided.gpu)


def live_workload(
    source: PrometheusSource, spec: LLMDeploymentSpec, namespace: str, served: str
) -> WorkloadSpec | None:
    """The trial workload shaped like live traffic over the SLO window: its arrival rate and
    mean prompt and output lengths. None until there has been traffic to copy."""
    window = spec.slo.window if spec.slo else "5m"
    try:
        fingerprint = source.workload_fingerprint(
            window, vllm_selector(model_name=served, namespace=namespace)
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
