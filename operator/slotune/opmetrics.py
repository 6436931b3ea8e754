"""The operator's own Prometheus metrics: each LLMDeployment's status as series, and how the
reconciles go.

Per-object series are *derived from status*, never counted in memory. The status is the
record that survives an operator restart (the operator re-reads it and publishes the same
values at once), and its figures may go down as well as up (a new study may count its trials
afresh), so the trial counts are gauges that mirror `status.tuning`: a counter would restart at
zero with the process and could only rise again by what this process saw, and `rate()` would
read the restart as a reset followed by a burst of trials. Only what happens inside this process
(reconciles, their errors and durations) is counted with counters.

`observe` turns one status into its series (a pure function, `status_series`) and replaces the
object's previous set whole, so a series for a state the object left (an old phase, a target
removed from the spec) disappears instead of going stale; `forget` drops them all. The series
are built at scrape time from that table, on the module's own `CollectorRegistry`: nothing
here touches the process-wide default registry. Its help texts say what each series means.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slotune.models import (
    ConditionType,
    LLMDeploymentSpec,
    LLMDeploymentStatus,
    Phase,
    TuningState,
)

PREFIX = "slotune_llmdeployment_"

# Reconciles are API round trips: tens of milliseconds when nothing changed, seconds when the
# API server is slow or many children are applied.
RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_OBJECT = ("namespace", "name")

# name (without PREFIX) -> (help, labels beyond namespace and name)
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "info": (
        "1 for every LLMDeployment the operator serves; model is the model id, model_name the "
        "served name (vLLM's model_name label, to join engine metrics on namespace and "
        "model_name).",
        ("model", "model_name"),
    ),
    "phase": ("1 for the LLMDeployment's current status.phase, 0 for the others.", ("phase",)),
    "condition": (
        "1 for each status condition's current status (True, False or Unknown), 0 for the "
        "other two.",
        ("type", "status"),
    ),
    "replicas_desired": (
        "Serving replicas slotune sets: spec.replicas, or the count Capacity scaling chose "
        "(status.replicas).",
        (),
    ),
    "replicas_ready": ("Serving replicas that are ready.", ()),
    "replicas_needed": (
        "Replicas the peak demand needs: ceil(demand x (1 + headroom) / capacity per replica), "
        "before minReplicas and maxReplicas (status.scaling.neededReplicas; Capacity and "
        "External scaling). What an HPA or KEDA scales on.",
        (),
    ),
    "demand_requests_per_second": (
        "Peak arrival rate over the stabilization window (status.scaling.demand).",
        (),
    ),
    "capacity_per_replica_requests_per_second": (
        "Requests/s one replica of the serving configuration carries within the SLO; bound is "
        "estimate, low or high (the 95% interval; status.scaling).",
        ("bound",),
    ),
    "slo_met": (
        "1 when every SLO target holds, 0 when one is missed; absent while unknown (not "
        "measured yet, or no SLO).",
        (),
    ),
    "slo_observed_seconds": (
        "The measured latency at an SLO target's percentile (status.slo.targets), in seconds.",
        ("target",),
    ),
    "slo_target_met": (
        "1 when an SLO target holds, 0 when it is missed (status.slo.targets); absent while "
        "unknown.",
        ("target",),
    ),
    "slo_target_seconds": ("The SLO bound for a target (spec.slo), in seconds.", ("target",)),
    "slo_target_percentile": (
        "The percentile an SLO target bounds (spec.slo), e.g. 95.",
        ("target",),
    ),
    "tuning_enabled": ("1 when spec.tuning.enabled, 0 otherwise.", ()),
    "tuning_state": (
        "1 for the study's current status.tuning.state, 0 for the others; absent before any study.",
        ("state",),
    ),
    "tuning_study": ("Studies started so far (status.tuning.study).", ()),
    "trials_completed": (
        "Trials of the current study that finished (status.tuning.trialsCompleted). A gauge: "
        "it mirrors status, which may count afresh for a new study.",
        (),
    ),
    "trials_failed": (
        "Trials of the current study that failed to run (status.tuning.trialsFailed).",
        (),
    ),
    "trials_max": ("The trial budget of the study (status.tuning.maxTrials).", ()),
    "best_score": (
        "Score of the best trial that met every SLO (higher is better); absent while no trial has.",
        (),
    ),
    "best_trial": ("Number of the best trial that met every SLO.", ()),
    "gpu_throttled": (
        "1 while the serving GPUs' clocks are throttled (GPUThrottled condition), 0 when not; "
        "absent while unknown.",
        (),
    ),
    "gpu_sm_clock_hertz": ("SM clock of the serving GPUs (status.gpu).", ()),
    "gpu_max_sm_clock_hertz": ("Highest SM clock the serving GPUs support (status.gpu).", ()),
    "gpu_memory_used_bytes": ("GPU memory the serving pods use (status.gpu).", ()),
    "gpu_temperature_celsius": ("GPU temperature of the serving pods (status.gpu).", ()),
}

_TRUTH = {"True": 1.0, "False": 0.0}
_CONDITION_STATES = ("True", "False", "Unknown")
_MHZ = 1e6
_MIB = float(1 << 20)


@dataclass(frozen=True)
class Series:
    """One sample: a family of FAMILIES, its extra label values in order, and the value."""

    family: str
    labels: tuple[str, ...]
    value: float


def _one_hot(family: str, current: str, choices: Iterable[str]) -> list[Series]:
    return [Series(family, (choice,), 1.0 if choice == current else 0.0) for choice in choices]


def _condition_value(status: LLMDeploymentStatus, type_: str) -> float | None:
    condition = status.condition(type_)
    return None if condition is None else _TRUTH.get(condition.status)


class _Series(list[Series]):
    """Series being collected; `put` skips a value that is unknown."""

    def put(self, family: str, value: float | None, *labels: str) -> None:
        if value is not None:
            self.append(Series(family, labels, float(value)))


def status_series(
    name: str, status: LLMDeploymentStatus, spec: LLMDeploymentSpec | None
) -> list[Series]:
    """Every per-object series one status (and the spec it was computed for) stands for."""
    out = _Series()
    if spec is not None:
        _spec_series(out, name, spec)
    if status.phase is not None:
        out += _one_hot("phase", status.phase, (p.value for p in Phase))
    for condition in status.conditions:
        out += [
            Series("condition", (condition.type, state), 1.0 if condition.status == state else 0.0)
            for state in _CONDITION_STATES
        ]
    out.put("replicas_ready", status.ready_replicas)
    # What slotune set (Capacity scaling's count included); the spec's before any status.
    desired = status.replicas
    if desired is None and spec is not None:
        desired = spec.replicas
    out.put("replicas_desired", desired)
    _scaling_series(out, status)
    _slo_series(out, status)
    _tuning_series(out, status)
    _gpu_series(out, status)
    return list(out)


def _spec_series(out: _Series, name: str, spec: LLMDeploymentSpec) -> None:
    # vLLM's model_name label is the served name, which defaults to the object's name.
    out.put("info", 1.0, spec.model.name, spec.model.served_name or name)
    out.put("tuning_enabled", 1.0 if spec.tuning.enabled else 0.0)
    if spec.slo is not None:
        for target, bound in spec.slo.targets().items():
            out.put("slo_target_seconds", bound.max_seconds, target)
            out.put("slo_target_percentile", bound.percentile, target)


def _scaling_series(out: _Series, status: LLMDeploymentStatus) -> None:
    scaling = status.scaling
    if scaling is None:
        return
    out.put("replicas_needed", scaling.needed_replicas)
    out.put("demand_requests_per_second", scaling.demand)
    out.put("capacity_per_replica_requests_per_second", scaling.capacity_per_replica, "estimate")
    out.put("capacity_per_replica_requests_per_second", scaling.capacity_low, "low")
    out.put("capacity_per_replica_requests_per_second", scaling.capacity_high, "high")


def _slo_series(out: _Series, status: LLMDeploymentStatus) -> None:
    # The SLOMet condition is what `kubectl get` and on-call read; the raw flag covers a
    # status written without it.
    if status.condition(ConditionType.SLO_MET) is not None:
        out.put("slo_met", _condition_value(status, ConditionType.SLO_MET))
    elif status.slo is not None and status.slo.met is not None:
        out.put("slo_met", 1.0 if status.slo.met else 0.0)
    if status.slo is None:
        return
    for measured in status.slo.targets:
        out.put("slo_observed_seconds", measured.observed_seconds, measured.name)
        if measured.met is not None:
            out.put("slo_target_met", 1.0 if measured.met else 0.0, measured.name)
    if not status.slo.targets:  # a status written before per-target figures existed
        out.put("slo_observed_seconds", status.slo.ttft_p95_seconds, "ttft")
        out.put("slo_observed_seconds", status.slo.tpot_p95_seconds, "tpot")


def _tuning_series(out: _Series, status: LLMDeploymentStatus) -> None:
    tuning = status.tuning
    if tuning is None:
        return
    if tuning.state is not None:
        out += _one_hot("tuning_state", tuning.state, (s.value for s in TuningState))
    out.put("tuning_study", tuning.study)
    out.put("trials_completed", tuning.trials_completed)
    out.put("trials_failed", tuning.trials_failed)
    out.put("trials_max", tuning.max_trials)
    best = tuning.best
    if best is not None and best.feasible is not False and best.score is not None:
        out.put("best_score", best.score)
        out.put("best_trial", best.number)


def _gpu_series(out: _Series, status: LLMDeploymentStatus) -> None:
    out.put("gpu_throttled", _condition_value(status, ConditionType.GPU_THROTTLED))
    gpu = status.gpu
    if gpu is None:
        return
    if gpu.sm_clock_mhz is not None:
        out.put("gpu_sm_clock_hertz", gpu.sm_clock_mhz * _MHZ)
    if gpu.max_sm_clock_mhz is not None:
        out.put("gpu_max_sm_clock_hertz", gpu.max_sm_clock_mhz * _MHZ)
    if gpu.memory_used_mib is not None:
        out.put("gpu_memory_used_bytes", gpu.memory_used_mib * _MIB)
    out.put("gpu_temperature_celsius", gpu.temperature_c)


class _StatusCollector(Collector):
    """Builds the per-object families from the latest series of every object, per scrape."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return self._families({})

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return self._families(self._metrics.snapshot())

    @staticmethod
    def _families(
        objects: Mapping[tuple[str, str], list[Series]],
    ) -> Iterator[GaugeMetricFamily]:
        families = {
            family: GaugeMetricFamily(PREFIX + family, help_, labels=[*_OBJECT, *extra])
            for family, (help_, extra) in FAMILIES.items()
        }
        for (namespace, name), series in sorted(objects.items()):
            for one in series:
                families[one.family].add_metric([namespace, name, *one.labels], one.value)
        return iter(families.values())


class OperatorMetrics:
    """One registry: the per-object series, the reconcile counters and the build info."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], list[Series]] = {}
        self.registry.register(_StatusCollector(self))
        self._reconciles = Counter(
            "slotune_reconciles",
            "Reconciles of LLMDeployments run by this operator process.",
            registry=self.registry,
        )
        self._errors = Counter(
            "slotune_reconcile_errors",
            "Reconciles that ended in an error (API call failed, unexpected exception).",
            registry=self.registry,
        )
        self._requests = Counter(
            "slotune_api_requests",
            "Requests this operator process's own code sent to the Kubernetes API server, by "
            "verb (Kopf's watches and its bookkeeping patches are not counted).",
            ["verb"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "slotune_reconcile_duration_seconds",
            "How long one reconcile took, errors included.",
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        build = Gauge(
            "slotune_build_info",
            "1, labelled with the version of the running operator.",
            ["version"],
            registry=self.registry,
        )
        build.labels(_version()).set(1)

    def observe(
        self,
        namespace: str,
        name: str,
        status: LLMDeploymentStatus,
        spec: LLMDeploymentSpec | None,
    ) -> None:
        """Publishes one LLMDeployment's status, replacing what was published for it."""
        series = status_series(name, status, spec)
        with self._lock:
            self._objects[(namespace, name)] = series

    def forget(self, namespace: str, name: str) -> None:
        """Drops every series of a deleted LLMDeployment."""
        with self._lock:
            self._objects.pop((namespace, name), None)

    def record_reconcile(self, seconds: float, error: bool) -> None:
        self._reconciles.inc()
        self._duration.observe(seconds)
        if error:
            self._errors.inc()

    def record_request(self, verb: str) -> None:
        self._requests.labels(verb).inc()

    def snapshot(self) -> dict[tuple[str, str], list[Series]]:
        with self._lock:
            return dict(self._objects)

    def exposition(self) -> str:
        """The text a scrape gets."""
        return generate_latest(self.registry).decode()

    def serve(self, port: int, addr: str = "0.0.0.0") -> WSGIServer:  # noqa: S104 - in a pod
        """Serves /metrics from a daemon thread; the server, for its port and shutdown()."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server


def _version() -> str:
    try:
        return metadata.version("slotune")
    except metadata.PackageNotFoundError:
        return "unknown"


# The operator process's metrics. Tests make their own OperatorMetrics.
_operator = OperatorMetrics()
observe = _operator.observe
forget = _operator.forget
record_reconcile = _operator.record_reconcile
record_request = _operator.record_request
serve = _operator.serve
exposition = _operator.exposition
