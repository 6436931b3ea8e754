"""On-call enforcement: live SLO attainment, GPU throttling and re-tuning, from Prometheus.

Two halves, called by the reconciler one after the other. `read_live` is the I/O shell: it
asks Prometheus (through `slotune.metrics`) for the histogram of each SLO target over the SLO
window, the request rate, and the DCGM exporter's readings of the GPUs the serving pods hold.
It never raises for a Prometheus that is down or answers nonsense; the reading says so.
`evaluate` is pure, with the clock passed in: from the spec, the previous status and a reading
it decides the SLO and GPU status, the SLOMet, MetricsAvailable and GPUThrottled conditions,
whether a re-tune is due, and whether the reconciler must hold still.

The rules an on-call engineer can rely on:
- The SLO is judged from bucket counts (`slo.judge_histogram`), never from an interpolated
  quantile, by the attainment rule trials use: the fraction within the bound, with its Wilson
  interval, against the target percentile; met or violated only when the interval says so,
  undecided otherwise. A threshold the buckets cannot settle is reported as such, not guessed.
- No requests in the window: the SLO is unknown, not met.
- Prometheus cannot be read: nothing is re-decided. The last figures stay, marked stale, and
  SLOMet keeps its status: an outage is neither a violation nor a recovery.
- A re-tune is due once a violation has lasted `retune.after`, at least `retune.cooldown` after
  the last study started, and not while the GPUs are throttled: trials would measure the heat,
  not the settings.
- GPUThrottled is True only for a thermal or power reason (DCGM clock event reasons) with the
  SM clock below its maximum; an idle GPU or application clocks are not throttling.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from slotune import settings
from slotune.engine import DEFAULT_KIND, engine_for
from slotune.engine.base import Engine
from slotune.metrics import (
    METRICS,
    THROTTLING,
    Bucket,
    ClockEventReason,
    ClockEvents,
    MetricsUnavailable,
    PrometheusSource,
    Selector,
    counter_rate_query,
    dcgm_selector,
    decode_clock_event_reasons,
    model_selector,
    stable_error,
    window_seconds,
)
from slotune.models import (
    ConditionType,
    GpuStatus,
    LLMDeploymentSpec,
    LLMDeploymentStatus,
    SloStatus,
    SloTarget,
    SloTargetStatus,
    seconds,
)
from slotune.slo.attainment import CONFIDENCE, SLO_METRICS, requests_to_resolve, z_value
from slotune.slo.histogram import HistogramVerdict, combine, histogram_quantile, judge_histogram
from slotune.status import ConditionRow

PROMETHEUS_URL_ENV = settings.PROMETHEUS_URL
DEFAULT_WINDOW = "5m"  # the GPU-only reading of a spec without an SLO
PEAK_CLOCK_WINDOW = "1h"  # the maximum SM clock when the exporter does not export it
# Labels that tell GPUs apart across nodes, and name the pod holding each.
GPU_KEY: tuple[str, ...] = ("gpu", "UUID", "Hostname", "hostname", "exported_pod", "pod")
_MESSAGE_LIMIT = 600


def prometheus_url(spec: LLMDeploymentSpec, default: str | None) -> str | None:
    """Where this LLMDeployment's metrics are read: `spec.monitoring.prometheusURL`, else the
    operator-wide default (`$SLOTUNE_PROMETHEUS_URL`); None when neither is set."""
    return spec.monitoring.prometheus_url or default


# --- readings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetReading:
    """The cumulative buckets of one SLO target's histogram, increased over the window."""

    name: str  # ttft, tpot, itl or e2e
    metric: str | None  # the histogram read; None when no name it has had holds series
    buckets: tuple[Bucket, ...] = ()


@dataclass(frozen=True)
class GpuReading:
    """One GPU of a serving pod, as the DCGM exporter reports it."""

    gpu: str
    uuid: str
    pod: str
    sm_clock_mhz: float
    max_sm_clock_mhz: float | None = None  # DCGM_FI_DEV_MAX_SM_CLOCK, when exported
    peak_sm_clock_mhz: float | None = None  # the highest clock of the last hour
    clock_event_mask: int | None = None  # DCGM_FI_DEV_CLOCKS_EVENT_REASONS, when exported
    memory_used_mib: float | None = None
    temperature_c: float | None = None

    @property
    def name(self) -> str:
        return f"GPU {self.gpu} of pod {self.pod}" if self.pod else f"GPU {self.gpu}"


@dataclass(frozen=True)
class LiveReading:
    """What Prometheus showed at one moment; `available` False with `error` when it could not
    be read, and then nothing else is known."""

    at: datetime
    url: str
    namespace: str
    model: str  # the served name: the engine's model label (vLLM's model_name)
    window: str
    available: bool
    error: str | None = None
    unreachable: bool = False  # the server failed (no answer, a timeout, an error status)
    cause: str | None = None  # why, without the query: "timed out", "could not connect (...)"
    scraped: bool = False  # Prometheus holds the engine's series for this model
    engine: str = DEFAULT_KIND  # spec.engine.kind
    request_rate: float | None = None  # finished requests per second over the window
    targets: Mapping[str, TargetReading] = field(default_factory=dict)
    gpus: tuple[GpuReading, ...] = ()


def read_live(
    source: PrometheusSource,
    spec: LLMDeploymentSpec,
    *,
    namespace: str,
    served_name: str,
    now: datetime,
    trial_pods: Sequence[str] = (),
) -> LiveReading:
    """Read the SLO targets' histograms, the request rate and the GPUs of the serving pods
    (and of `trial_pods`) from Prometheus, every query evaluated at `now`.

    The serving pods are those whose vLLM series carry `model_name=served_name` in
    `namespace`; their GPUs are found by the DCGM exporter's pod labels. Never raises for an
    unreachable or erroring Prometheus: returns `available=False` with the error instead.
    """
    window = spec.slo.window if spec.slo is not None else DEFAULT_WINDOW
    engine = engine_for(spec.engine.kind)
    selector = model_selector(model_name=served_name, namespace=namespace, label=engine.model_label)
    at = now.timestamp()
    finished = engine.metrics["request_success"][0]
    try:
        present = f"count({finished}{selector})"
        scraped = source.query_value(present, at) is not None
        rate: float | None = None
        targets: dict[str, TargetReading] = {}
        pods: list[str] = list(trial_pods)
        if scraped:
            rate = source.query_value(counter_rate_query(finished, window, selector), at)
            if spec.slo is not None:
                targets = {
                    name: _read_target(
                        source, name, selector, window, at, candidates=engine.metrics.get(name, ())
                    )
                    for name in spec.slo.targets()
                }
            pods = [*_serving_pods(source, engine, selector, at), *pods]
        gpus = _read_gpus(source, namespace, pods, at) if spec.resources.gpus > 0 else ()
    except (MetricsUnavailable, ValueError, LookupError, TypeError) as err:
        return LiveReading(
            at=now,
            url=source.url,
            namespace=namespace,
            model=served_name,
            window=window,
            available=False,
            engine=spec.engine.kind,
            error=_error_text(source.url, err),
            unreachable=isinstance(err, MetricsUnavailable),
            cause=stable_error(err.__cause__) if isinstance(err.__cause__, Exception) else None,
        )
    return LiveReading(
        at=now,
        url=source.url,
        namespace=namespace,
        model=served_name,
        window=window,
        available=True,
        engine=spec.engine.kind,
        scraped=scraped,
        request_rate=rate,
        targets=targets,
        gpus=gpus,
    )


def _read_target(
    source: PrometheusSource,
    name: str,
    selector: Selector,
    window: str,
    at: float,
    *,
    candidates: Sequence[str],
) -> TargetReading:
    """The first of the engine's names for the target's histogram that has buckets (vLLM
    renamed TPOT's once); none where the engine has no histogram for it."""
    for metric in candidates:
        buckets = source.histogram_buckets(metric, selector, window, at)
        if buckets:
            return TargetReading(name, metric, tuple(buckets))
    return TargetReading(name, None)


def _serving_pods(
    source: PrometheusSource, engine: Engine, selector: Selector, at: float
) -> list[str]:
    running = engine.metrics["requests_running"][0]
    samples = source.query(f"count by (pod) ({running}{selector})", at)
    return sorted({s.labels["pod"] for s in samples if s.labels.get("pod")})


def gpu_query(logical: str, namespace: str, pods: Sequence[str], *, over: str | None = None) -> str:
    """Per GPU, the value of a DCGM signal (a key of `metrics.METRICS`) on the GPUs `pods`
    hold; with `over`, its highest value over that window.

    The exporter's pod labels arrive as `exported_namespace`/`exported_pod` when Prometheus
    scrapes it with `honorLabels: false` (its chart's default), as `namespace`/`pod`
    otherwise; and a signal may be exported under any name it has had. Both label styles and
    every name are asked for at once.
    """
    if not pods:
        raise ValueError("no pods to read GPUs of")
    pod_regex = "|".join(pod.replace(".", r"\.") for pod in pods)
    selectors = [
        dcgm_selector(namespace, exported=True).with_regex(exported_pod=pod_regex),
        dcgm_selector(namespace).with_regex(pod=pod_regex),
    ]
    series = [f"{name}{sel}" for name in METRICS[logical].candidates for sel in selectors]
    if over is not None:
        window_seconds(over)
        series = [f"max_over_time({s}[{over}])" for s in series]
    return f"max by ({', '.join(GPU_KEY)}) ({' or '.join(series)})"


GpuKey = tuple[str, ...]


def _read_gpus(
    source: PrometheusSource, namespace: str, pods: Sequence[str], at: float
) -> tuple[GpuReading, ...]:
    if not pods:
        return ()

    def per_gpu(logical: str, over: str | None = None) -> dict[GpuKey, float]:
        samples = source.query(gpu_query(logical, namespace, pods, over=over), at)
        return {
            tuple(s.labels.get(label, "") for label in GPU_KEY): s.value
            for s in samples
            if not math.isnan(s.value)
        }

    clocks = per_gpu("gpu_sm_clock")
    if not clocks:
        return ()
    maxima = per_gpu("gpu_max_sm_clock")
    peaks = per_gpu("gpu_sm_clock", over=PEAK_CLOCK_WINDOW)
    masks = per_gpu("gpu_clock_event_reasons")
    memory = per_gpu("gpu_fb_used")
    temperature = per_gpu("gpu_temperature")
    readings = []
    for key in sorted(clocks):
        labels = dict(zip(GPU_KEY, key, strict=True))
        mask = masks.get(key)
        readings.append(
            GpuReading(
                gpu=labels["gpu"],
                uuid=labels["UUID"] or labels["Hostname"] or labels["hostname"],
                # With honorLabels false, `pod` is the exporter's own pod.
                pod=labels["exported_pod"] or labels["pod"],
                sm_clock_mhz=clocks[key],
                max_sm_clock_mhz=maxima.get(key),
                peak_sm_clock_mhz=peaks.get(key),
                clock_event_mask=int(mask) if mask is not None and mask == int(mask) >= 0 else None,
                memory_used_mib=memory.get(key),
                temperature_c=temperature.get(key),
            )
        )
    return tuple(readings)


def _error_text(url: str, err: Exception) -> str:
    text = str(err)
    if not isinstance(err, MetricsUnavailable):
        text = f"Prometheus at {url} answered something unexpected: {type(err).__name__}: {text}"
    # Object addresses differ on every attempt; the condition's message should not.
    text = re.sub(r" at 0x[0-9a-f]+", "", text)
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


# --- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OnCall:
    """What the reconciler does with one reading.

    `slo` and `gpu` replace `status.slo` and `status.gpu`; `conditions` are rows to merge
    (`status.merge_condition`); `retune` says why a new study is due now (None: not due);
    `hold`: Prometheus cannot be read, so no tuning decision may be taken; `throttled`: the
    GPUs run slowed by heat or power, so what is measured now is not to be trusted.
    """

    slo: SloStatus | None
    gpu: GpuStatus | None
    conditions: list[ConditionRow]
    retune: str | None
    hold: bool
    throttled: bool


def evaluate(
    spec: LLMDeploymentSpec,
    previous: LLMDeploymentStatus,
    reading: LiveReading | None,
    now: datetime,
    *,
    last_study_started: datetime | None,
) -> OnCall:
    """Decide the on-call state from a reading (None: no Prometheus is configured)."""
    hold = reading is not None and not reading.available
    gpu, gpu_row = _gpu(spec, previous, reading)
    throttled = gpu_row is not None and gpu_row[1] == "True"
    slo, slo_row = _slo(spec, previous, reading, now)
    retune, note = _retune(spec, slo, now, last_study_started, hold=hold, throttled=throttled)
    rows: list[ConditionRow] = []
    if slo_row is not None:
        if note is not None:
            slo_row = (*slo_row[:3], f"{slo_row[3]}; {note}")
        rows.append(slo_row)
    rows.append(_metrics_available(reading))
    if gpu_row is not None:
        rows.append(gpu_row)
    return OnCall(slo=slo, gpu=gpu, conditions=rows, retune=retune, hold=hold, throttled=throttled)


def _metrics_available(reading: LiveReading | None) -> ConditionRow:
    if reading is None:
        return (
            ConditionType.METRICS_AVAILABLE,
            "Unknown",
            "NotConfigured",
            "no Prometheus URL: set spec.monitoring.prometheusURL, "
            f"or {PROMETHEUS_URL_ENV} on the operator",
        )
    if not reading.available:
        return (ConditionType.METRICS_AVAILABLE, "False", "QueryFailed", reading.error or "")
    return (ConditionType.METRICS_AVAILABLE, "True", "Available", f"{reading.url} answered")


# --- the SLO --------------------------------------------------------------------------------


def _slo(
    spec: LLMDeploymentSpec,
    previous: LLMDeploymentStatus,
    reading: LiveReading | None,
    now: datetime,
) -> tuple[SloStatus | None, ConditionRow | None]:
    if spec.slo is None:
        return None, None
    if reading is None:
        return None, (
            ConditionType.SLO_MET,
            "Unknown",
            "NotMeasured",
            "no Prometheus to read the SLO from: set spec.monitoring.prometheusURL, "
            f"or {PROMETHEUS_URL_ENV} on the operator",
        )
    if not reading.available:
        return _kept_slo(previous, reading)

    window = spec.slo.window
    targets = spec.slo.targets()
    verdicts = {
        name: _judge(reading.targets.get(name), target.percentile, target.max_seconds, window)
        for name, target in targets.items()
    }
    met = combine([v.met for v in verdicts.values()]) if reading.scraped else None
    since = None
    if met is False:
        kept = previous.slo.violating_since if previous.slo is not None else None
        since = kept or now
    slo = SloStatus(
        ttft_p95_seconds=_estimate(reading.targets.get("ttft"), 95),
        tpot_p95_seconds=_estimate(reading.targets.get("tpot"), 95),
        met=met,
        window=window,
        measured_at=reading.at,
        request_rate=reading.request_rate,
        targets=[
            SloTargetStatus(
                name=name,
                percentile=target.percentile,
                max_seconds=target.max_seconds,
                observed_seconds=_estimate(reading.targets.get(name), target.percentile),
                met=verdicts[name].met,
                requests=round(verdicts[name].observations),
            )
            for name, target in targets.items()
        ],
        violating_since=since,
    )
    return slo, _slo_row(reading, verdicts, met, targets)


def _kept_slo(
    previous: LLMDeploymentStatus, reading: LiveReading
) -> tuple[SloStatus | None, ConditionRow]:
    """Prometheus cannot be read: the last figures, stale, and SLOMet as it was."""
    last = previous.slo
    kept = previous.condition(ConditionType.SLO_MET)
    if last is None or last.measured_at is None:
        return last, (
            ConditionType.SLO_MET,
            "Unknown",
            "MetricsUnavailable",
            f"the SLO cannot be read: {reading.error}",
        )
    stale = last.model_copy(update={"stale": True})
    if kept is None:
        return stale, (ConditionType.SLO_MET, "Unknown", "MetricsUnavailable", "")
    return stale, (kept.type, kept.status, kept.reason, kept.message)


def _judge(
    reading: TargetReading | None, percentile: float, max_seconds: float, window: str
) -> HistogramVerdict:
    if reading is None or all(count <= 0 for _, count in reading.buckets):
        return HistogramVerdict(None, True, f"no observations in the last {window}", None, 0.0)
    return judge_histogram(reading.buckets, percentile, max_seconds, confidence=CONFIDENCE)


def _estimate(reading: TargetReading | None, percentile: float) -> float | None:
    if reading is None or not reading.buckets:
        return None
    value = histogram_quantile(percentile, reading.buckets)
    return None if math.isnan(value) else float(f"{value:.4g}")


def _slo_row(
    reading: LiveReading,
    verdicts: Mapping[str, HistogramVerdict],
    met: bool | None,
    targets: Mapping[str, SloTarget],
) -> ConditionRow:
    if not reading.scraped:
        engine = engine_for(reading.engine)
        return (
            ConditionType.SLO_MET,
            "Unknown",
            "NotScraped",
            f"{reading.url} has no {engine.title} series for {engine.model_label}="
            f"{reading.model!r} in namespace "
            f"{reading.namespace}: check that it scrapes the serving pods (a PodMonitor, or "
            "the prometheus.io/scrape annotations)",
        )
    window = f"over the last {reading.window}"
    if met is True:
        return (ConditionType.SLO_MET, "True", "Met", f"{_figures(verdicts)} {window}")
    if met is False:
        violated = "; ".join(f"{n}: {v.reason}" for n, v in verdicts.items() if v.met is False)
        return (ConditionType.SLO_MET, "False", "Violated", f"{violated} ({window})")
    rate = reading.request_rate or 0.0
    if rate <= 0 and all(v.observations <= 0 for v in verdicts.values()):
        return (
            ConditionType.SLO_MET,
            "Unknown",
            "NoTraffic",
            f"no requests to {reading.model} {window}: the SLO is not judged without traffic",
        )
    short = _window_too_short(reading, verdicts, targets)
    if short:
        return (ConditionType.SLO_MET, "Unknown", "WindowTooShort", short)
    open_ = "; ".join(f"{n}: {v.reason}" for n, v in verdicts.items() if v.met is None)
    undecidable = any(not v.resolvable for v in verdicts.values() if v.met is None)
    return (
        ConditionType.SLO_MET,
        "Unknown",
        "Undecidable" if undecidable else "NotMeasured",
        f"{open_} ({window})",
    )


def _window_too_short(
    reading: LiveReading, verdicts: Mapping[str, HistogramVerdict], targets: Mapping[str, SloTarget]
) -> str:
    """Why an open per-request target can never be met at the current traffic, if so: a window
    holding fewer requests than the attainment interval needs to clear the target percentile
    even when every request is within the bound. More of the same traffic does not help there,
    a longer window does. Empty when some target can still be met."""
    rate = reading.request_rate or 0.0
    if rate <= 0:
        return ""
    expected = rate * seconds(reading.window)
    z = z_value(CONFIDENCE)
    short: dict[str, int] = {}
    for name, verdict in verdicts.items():
        needed = requests_to_resolve(targets[name].percentile, z)
        if verdict.met is None and SLO_METRICS[name].unit == "request" and expected < needed:
            short[name] = needed
    if not short:
        return ""
    text = "; ".join(
        f"{name}: p{targets[name].percentile:g} needs at least {needed} requests in the window "
        f"to be met, and at {rate:.3g} requests/s the last {reading.window} holds about "
        f"{expected:.0f}"
        for name, needed in short.items()
    )
    # A margin over the bare count: the window's count varies with the arrivals.
    window = math.ceil(1.2 * max(short.values()) / rate)
    return f"{text}: set spec.slo.window to {window}s or more (a violation shows at any window)"


def _figures(verdicts: Mapping[str, HistogramVerdict]) -> str:
    return "; ".join(f"{name}: {v.reason}" for name, v in verdicts.items())


# --- re-tuning ------------------------------------------------------------------------------


def _retune(
    spec: LLMDeploymentSpec,
    slo: SloStatus | None,
    now: datetime,
    last_study_started: datetime | None,
    *,
    hold: bool,
    throttled: bool,
) -> tuple[str | None, str | None]:
    """(why a re-tune is due now, or None; what happens next, for SLOMet's message)."""
    if hold or slo is None or slo.met is not False or slo.violating_since is None:
        return None, None
    if not spec.tuning.enabled:
        return None, None
    policy = spec.tuning.retune
    if not policy.on_slo_violation:
        return None, "re-tuning on violation is off (spec.tuning.retune.onSloViolation)"
    since = slo.violating_since
    due = since + timedelta(seconds=seconds(policy.after))
    if now < due:
        return None, f"a re-tune is due at {_when(due)} if the violation lasts"
    if last_study_started is not None:
        allowed = last_study_started + timedelta(seconds=seconds(policy.cooldown))
        if now < allowed:
            return None, (
                f"re-tuning waits for the cool-down until {_when(allowed)} (the last study "
                f"started at {_when(last_study_started)}; retune.cooldown {policy.cooldown})"
            )
    if throttled:
        return None, "re-tuning waits while the GPUs are throttled"
    violated = ", ".join(_over_bound(t) for t in slo.targets if t.met is False)
    lasted = _duration((now - since).total_seconds())
    return (
        f"the SLO has been violated for {lasted}, since {_when(since)} "
        f"(retune.after {policy.after}): {violated}"
    ), None


def _over_bound(target: SloTargetStatus) -> str:
    observed = "" if target.observed_seconds is None else f" ~{target.observed_seconds:.3g}s"
    return f"p{target.percentile:g} {target.name}{observed} > {target.max_seconds:g}s"


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(total: float) -> str:
    """Seconds as `1h30m`, `15m` or `45s`."""
    left = max(int(total), 0)
    hours, left = divmod(left, 3600)
    minutes, secs = divmod(left, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{secs}s" if secs or not text else "")


# --- the GPUs -------------------------------------------------------------------------------

_REASON_ORDER = [str(reason.name).lower() for reason in ClockEventReason]
_THROTTLING_NAMES = {str(r.name).lower() for r in ClockEventReason if r & THROTTLING}


def _throttling(gpu: GpuReading, events: ClockEvents) -> bool:
    """Slowed by heat or power: a throttling reason, and the clock below its maximum (when
    the exporter says what the maximum is)."""
    at_max = gpu.max_sm_clock_mhz is not None and gpu.sm_clock_mhz >= gpu.max_sm_clock_mhz
    return events.throttled and not at_max


def _gpu(
    spec: LLMDeploymentSpec, previous: LLMDeploymentStatus, reading: LiveReading | None
) -> tuple[GpuStatus | None, ConditionRow | None]:
    if spec.resources.gpus == 0:
        return None, None
    if reading is None:
        return None, (
            ConditionType.GPU_THROTTLED,
            "Unknown",
            "NoGPUMetrics",
            "no Prometheus to read the DCGM exporter's metrics from",
        )
    if not reading.available:
        kept = previous.condition(ConditionType.GPU_THROTTLED)
        last = previous.gpu
        stale = last.model_copy(update={"stale": True}) if last is not None else None
        if kept is not None and last is not None:
            return stale, (kept.type, kept.status, kept.reason, kept.message)
        return stale, (
            ConditionType.GPU_THROTTLED,
            "Unknown",
            "MetricsUnavailable",
            "Prometheus cannot be read",
        )
    if not reading.gpus:
        return None, (
            ConditionType.GPU_THROTTLED,
            "Unknown",
            "NoGPUMetrics",
            f"{reading.url} has no DCGM exporter series (DCGM_FI_DEV_SM_CLOCK) for the GPUs "
            "of the serving pods: deploy NVIDIA's dcgm-exporter with its Kubernetes pod mapping",
        )
    events = {
        gpu: decode_clock_event_reasons(gpu.clock_event_mask)
        for gpu in reading.gpus
        if gpu.clock_event_mask is not None
    }
    throttled = [gpu for gpu, ev in events.items() if _throttling(gpu, ev)]
    return _gpu_status(reading, events, throttled), _gpu_row(reading, events, throttled)


def _gpu_status(
    reading: LiveReading, events: Mapping[GpuReading, ClockEvents], throttled: list[GpuReading]
) -> GpuStatus:
    gpus = reading.gpus
    maxima = [
        m
        for g in gpus
        if (m := g.max_sm_clock_mhz if g.max_sm_clock_mhz is not None else g.peak_sm_clock_mhz)
        is not None
    ]
    memory = [g.memory_used_mib for g in gpus if g.memory_used_mib is not None]
    temperatures = [g.temperature_c for g in gpus if g.temperature_c is not None]
    every = {r for ev in events.values() for r in ev.reasons}
    limiting = {r for g in throttled for r in events[g].reasons if r in _THROTTLING_NAMES}
    return GpuStatus(
        sm_clock_mhz=min(g.sm_clock_mhz for g in gpus),
        max_sm_clock_mhz=max(maxima) if maxima else None,
        throttle_reasons=[r for r in _REASON_ORDER if r in limiting],
        memory_used_mib=max(memory) if memory else None,
        temperature_c=max(temperatures) if temperatures else None,
        clock_event_reasons=[r for r in _REASON_ORDER if r in every],
        gpus=len(gpus),
        measured_at=reading.at,
    )


def _clock_text(gpu: GpuReading, events: ClockEvents | None) -> str:
    ceiling = gpu.max_sm_clock_mhz if gpu.max_sm_clock_mhz is not None else gpu.peak_sm_clock_mhz
    clock = f"{gpu.sm_clock_mhz:g}" + (f" of {ceiling:g}" if ceiling is not None else "")
    reasons = ", ".join(events.reasons) if events is not None and events.reasons else "none"
    return f"{gpu.name} at {clock} MHz (clock event reasons: {reasons})"


def _gpu_row(
    reading: LiveReading, events: Mapping[GpuReading, ClockEvents], throttled: list[GpuReading]
) -> ConditionRow:
    if throttled:
        if any(events[g].thermal for g in throttled):
            reason = "Thermal"
        elif any(events[g].power for g in throttled):
            reason = "Power"
        else:
            reason = "HardwareSlowdown"
        slowed = "; ".join(_clock_text(g, events[g]) for g in throttled)
        return (ConditionType.GPU_THROTTLED, "True", reason, slowed)
    unknown = [g for g in reading.gpus if g not in events]
    if unknown:
        return (
            ConditionType.GPU_THROTTLED,
            "Unknown",
            "NoClockEventReasons",
            "the DCGM exporter does not export DCGM_FI_DEV_CLOCKS_EVENT_REASONS for "
            + ", ".join(g.name for g in unknown)
            + ", so a low clock cannot be told from an idle GPU: add the field to its "
            "counters CSV",
        )
    other = [g for g in reading.gpus if events[g].reasons]
    message = f"no thermal or power limit on {len(reading.gpus)} GPU(s)"
    if other:
        message += "; " + "; ".join(_clock_text(g, events[g]) for g in other)
    return (ConditionType.GPU_THROTTLED, "False", "NotThrottled", message)
