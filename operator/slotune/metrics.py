"""What slotune reads from vLLM and the GPUs, and where it reads it from.

The PromQL shapes are pure functions of plain data (metric names, a label selector, a
window), so the queries the operator sends are unit-tested as text; the builders only the tests
use live in `tests/support/promql.py`. Metric names moved between
vLLM and DCGM exporter versions; `METRICS` lists the candidates for each logical signal, newest
first, and `resolve_names` picks the ones a source actually exposes. Two sources do the I/O:
`PrometheusSource` (the only user of prometheus-api-client) for clusters, and `ScrapeSource`,
which reads an engine's own `/metrics` for local runs.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntFlag
from typing import Any, Literal

import requests
from prometheus_client.parser import text_string_to_metric_families

from slotune.engine.base import MetricKind
from slotune.engine.vllm import SERIES as VLLM_SERIES
from slotune.models import seconds

# --- metric names across versions ---------------------------------------------------------


@dataclass(frozen=True)
class MetricName:
    """A logical signal and the exposed names it has had, newest first.

    Counters are named with their `_total` suffix; histograms by their base name (the series
    are `<base>_bucket`, `<base>_sum` and `<base>_count`).
    """

    kind: MetricKind
    candidates: tuple[str, ...]

    @property
    def default(self) -> str:
        return self.candidates[0]


METRICS: Mapping[str, MetricName] = {
    # vLLM's series (the engine adapter's table)
    **{signal: MetricName(kind, names) for signal, (kind, names) in VLLM_SERIES.items()},
    # DCGM exporter (vllm.md §5)
    "gpu_sm_clock": MetricName("gauge", ("DCGM_FI_DEV_SM_CLOCK",)),
    # Not in the exporter's default CSV; used when a custom CSV adds it.
    "gpu_max_sm_clock": MetricName("gauge", ("DCGM_FI_DEV_MAX_SM_CLOCK",)),
    "gpu_clock_event_reasons": MetricName(
        "gauge", ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    ),
    "gpu_fb_used": MetricName("gauge", ("DCGM_FI_DEV_FB_USED",)),
    "gpu_temperature": MetricName("gauge", ("DCGM_FI_DEV_GPU_TEMP",)),
    "gpu_power": MetricName("gauge", ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS")),
}

LatencySignal = Literal["ttft", "tpot", "itl", "e2e", "queue_time", "prefill_time", "decode_time"]


def _exposed_series(name: str, kind: MetricKind) -> str:
    """The series name that proves a metric is exposed."""
    return f"{name}_bucket" if kind == "histogram" else name


@dataclass(frozen=True)
class MetricNames:
    """Logical signal → the name to query. Defaults to the newest names."""

    names: Mapping[str, str] = field(
        default_factory=lambda: {key: metric.default for key, metric in METRICS.items()}
    )
    missing: frozenset[str] = frozenset()
    resolved: bool = False  # True when checked against what a source exposes

    def exposes(self, logical: str) -> bool | None:
        """Whether the source exposes the signal; None when the names were not resolved."""
        return logical not in self.missing if self.resolved else None

    def __getitem__(self, logical: str) -> str:
        return self.names[logical]


DEFAULT_NAMES = MetricNames()


def names_for(engine_metrics: Mapping[str, tuple[str, ...]]) -> MetricNames:
    """The names to query for an engine's series: each signal the engine adapter names
    (`Engine.metrics`) by the adapter's newest name. The engine signals it does not name are
    `missing`, and the queries leave them out; the GPU signals (DCGM's) stay as they are."""
    names = dict(DEFAULT_NAMES.names)
    names.update({signal: found[0] for signal, found in engine_metrics.items() if found})
    lacking = {
        signal
        for signal in METRICS
        if not signal.startswith("gpu_") and not engine_metrics.get(signal)
    }
    return MetricNames(names, frozenset(lacking), resolved=True)


def resolve_names(exposed: Iterable[str]) -> MetricNames:
    """Pick, for each logical signal, the first candidate among the exposed series names
    (as `__name__` label values, e.g. `vllm:time_to_first_token_seconds_bucket`). A signal
    with no exposed candidate keeps its newest name and is listed in `missing`."""
    present = set(exposed)
    names: dict[str, str] = {}
    missing: set[str] = set()
    for logical, metric in METRICS.items():
        found = next(
            (c for c in metric.candidates if _exposed_series(c, metric.kind) in present), None
        )
        if found is None:
            missing.add(logical)
        names[logical] = found or metric.default
    return MetricNames(names, frozenset(missing), resolved=True)


# --- selectors and windows ----------------------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(frozen=True)
class Selector:
    """Label matchers, rendered as `{a="x",b=~"y|z"}` (empty when there are none):
    `labels` match exactly, `regex` as RE2 regular expressions."""

    labels: Mapping[str, str] = field(default_factory=dict)
    regex: Mapping[str, str] = field(default_factory=dict)

    def render(self) -> str:
        matchers = [(key, "=", value) for key, value in self.labels.items()]
        matchers += [(key, "=~", value) for key, value in self.regex.items()]
        if not matchers:
            return ""
        inner = ",".join(f'{key}{op}"{_escape(value)}"' for key, op, value in sorted(matchers))
        return "{" + inner + "}"

    def __str__(self) -> str:
        return self.render()

    def with_labels(self, **labels: str) -> Selector:
        return Selector({**self.labels, **labels}, self.regex)

    def with_regex(self, **regex: str) -> Selector:
        return Selector(self.labels, {**self.regex, **regex})


def model_selector(
    model_name: str | None = None,
    namespace: str | None = None,
    pod: str | None = None,
    *,
    label: str = "model_name",
) -> Selector:
    """Matchers for an engine's series: `model_name` is the served name, in the engine's
    `label` (`Engine.model_label`); `namespace` and `pod` are the target labels Prometheus adds
    when it scrapes pods."""
    given = {label: model_name, "namespace": namespace, "pod": pod}
    return Selector({key: value for key, value in given.items() if value is not None})


def dcgm_selector(
    namespace: str | None = None, pod: str | None = None, *, exported: bool = False
) -> Selector:
    """Matchers for DCGM exporter series of the GPUs a pod holds. With `honorLabels: false`
    the exporter's own pod labels arrive as `exported_namespace`/`exported_pod`."""
    prefix = "exported_" if exported else ""
    given = {f"{prefix}namespace": namespace, f"{prefix}pod": pod}
    return Selector({key: value for key, value in given.items() if value is not None})


def window_seconds(window: str) -> float:
    """Seconds in a Prometheus duration such as `5m` or `1h30m`."""
    return seconds(window)


def _quantile(percentile: float) -> str:
    if not 0 < percentile < 100:
        raise ValueError(f"percentile must be within 0..100 (exclusive), got {percentile}")
    return repr(round(percentile / 100, 10))


def group_by(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


# --- PromQL: generic histogram and counter shapes -----------------------------------------


def histogram_quantile_query(
    metric: str,
    percentile: float,
    window: str,
    selector: Selector = Selector(),
    by: Sequence[str] = (),
) -> str:
    """The pN of a histogram over a window, summed over the selected series first."""
    window_seconds(window)
    groups = group_by(("le", *by))
    return (
        f"histogram_quantile({_quantile(percentile)}, "
        f"sum{groups} (rate({metric}_bucket{selector}[{window}])))"
    )


def histogram_mean_query(
    metric: str, window: str, selector: Selector = Selector(), by: Sequence[str] = ()
) -> str:
    """Mean observation over a window: rate of the sum over rate of the count."""
    window_seconds(window)
    groups = group_by(by)
    return (
        f"sum{groups} (rate({metric}_sum{selector}[{window}]))"
        f" / sum{groups} (rate({metric}_count{selector}[{window}]))"
    )


def counter_rate_query(
    metric: str, window: str, selector: Selector = Selector(), by: Sequence[str] = ()
) -> str:
    window_seconds(window)
    return f"sum{group_by(by)} (rate({metric}{selector}[{window}]))"


# --- PromQL: the workload fingerprint of live traffic ---------------------------------------


def arrival_rate(
    window: str, selector: Selector = Selector(), *, names: MetricNames = DEFAULT_NAMES
) -> str:
    """Requests arriving per second. vLLM counts requests when they finish, not when they
    arrive, so arrivals = finished + the change in requests inside the engine (running and
    waiting) + requests the queue limits turned away, all over the window."""
    seconds = window_seconds(window)
    finished = counter_rate_query(names["request_success"], window, selector)
    in_engine = (
        f"(sum(delta({names['requests_running']}{selector}[{window}]))"
        f" + sum(delta({names['requests_waiting']}{selector}[{window}])))"
        f" / {seconds:g}"
    )
    if names.exposes("admission_rejections") is False:  # an engine without the counter
        return f"{finished} + {in_engine}"
    # Older vLLM has no admission counter: an absent series must not empty the sum.
    rejected = (
        f"({counter_rate_query(names['admission_rejections'], window, selector)} or vector(0))"
    )
    return f"{finished} + {in_engine} + {rejected}"


PEAK_RATE_WINDOW = "1m"  # the arrival rate whose peak scaling follows
PEAK_STEP = "15s"


def peak_arrival_rate(
    window: str,
    selector: Selector = Selector(),
    *,
    rate_window: str = PEAK_RATE_WINDOW,
    step: str = PEAK_STEP,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """The highest arrival rate (over `rate_window`, every `step`) within the last `window`:
    the demand Capacity scaling sizes the replicas for."""
    window_seconds(window)
    inner = arrival_rate(rate_window, selector, names=names)
    return f"max_over_time(({inner})[{window}:{step}])"


def prompt_length_mean(
    window: str, selector: Selector = Selector(), *, names: MetricNames = DEFAULT_NAMES
) -> str:
    return histogram_mean_query(names["request_prompt_tokens"], window, selector)


def prompt_length_quantile(
    percentile: float,
    window: str,
    selector: Selector = Selector(),
    *,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    return histogram_quantile_query(names["request_prompt_tokens"], percentile, window, selector)


def output_length_mean(
    window: str, selector: Selector = Selector(), *, names: MetricNames = DEFAULT_NAMES
) -> str:
    return histogram_mean_query(names["request_generation_tokens"], window, selector)


def output_length_quantile(
    percentile: float,
    window: str,
    selector: Selector = Selector(),
    *,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    return histogram_quantile_query(
        names["request_generation_tokens"], percentile, window, selector
    )


FINGERPRINT_PERCENTILES: tuple[float, ...] = (50, 90, 99)


def workload_fingerprint_queries(
    window: str,
    selector: Selector = Selector(),
    *,
    percentiles: Sequence[float] = FINGERPRINT_PERCENTILES,
    names: MetricNames = DEFAULT_NAMES,
) -> dict[str, str]:
    """Every query of the fingerprint, by key (`arrival_rate`, `prompt_mean`, `prompt_p50`,
    …, `output_mean`, `output_p99`). Token quantiles are interpolated inside vLLM's 1-2-5
    token buckets, so they are estimates; the means are exact."""
    queries = {"arrival_rate": arrival_rate(window, selector, names=names)}
    if names.exposes("request_prompt_tokens") is not False:  # else no prompt_* keys
        queries["prompt_mean"] = prompt_length_mean(window, selector, names=names)
        for p in percentiles:
            queries[f"prompt_p{p:g}"] = prompt_length_quantile(p, window, selector, names=names)
    if names.exposes("request_generation_tokens") is not False:  # else no output_* keys
        queries["output_mean"] = output_length_mean(window, selector, names=names)
        for p in percentiles:
            queries[f"output_p{p:g}"] = output_length_quantile(p, window, selector, names=names)
    return queries


@dataclass(frozen=True)
class WorkloadFingerprint:
    """The shape of live traffic over a window; None where there was no traffic."""

    window: str
    arrival_rate: float | None
    prompt_mean: float | None
    output_mean: float | None
    prompt_quantiles: dict[float, float | None]
    output_quantiles: dict[float, float | None]


# --- PromQL: DCGM exporter -----------------------------------------------------------------


class ClockEventReason(IntFlag):
    """Bits of `DCGM_FI_DEV_CLOCKS_EVENT_REASONS` (DCGM_CLOCKS_EVENT_REASON_*). Names follow
    the exporter's `clock_event` label values."""

    GPU_IDLE = 0x1
    CLOCKS_SETTING = 0x2
    POWER_CAP = 0x4  # SW power cap
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL = 0x20
    HW_THERMAL = 0x40
    HW_POWER_BRAKE = 0x80
    DISPLAY_CLOCKS = 0x100


# Reasons that mean the GPU is slowed below what the workload asks for: heat or power.
THROTTLING = (
    ClockEventReason.POWER_CAP
    | ClockEventReason.HW_SLOWDOWN
    | ClockEventReason.SW_THERMAL
    | ClockEventReason.HW_THERMAL
    | ClockEventReason.HW_POWER_BRAKE
)
THERMAL = ClockEventReason.SW_THERMAL | ClockEventReason.HW_THERMAL
POWER = ClockEventReason.POWER_CAP | ClockEventReason.HW_POWER_BRAKE


@dataclass(frozen=True)
class ClockEvents:
    """A decoded clock-event bitmask."""

    mask: int
    reasons: tuple[str, ...]
    unknown_bits: int

    @property
    def throttled(self) -> bool:
        return bool(self.mask & THROTTLING)

    @property
    def thermal(self) -> bool:
        return bool(self.mask & THERMAL)

    @property
    def power(self) -> bool:
        return bool(self.mask & POWER)


def decode_clock_event_reasons(mask: float) -> ClockEvents:
    """The reason names (lower case, as in `clock_event`) set in a bitmask; Prometheus hands
    the mask over as a float."""
    if mask < 0 or mask != int(mask):
        raise ValueError(f"not a clock-event bitmask: {mask}")
    bits = int(mask)
    reasons = tuple(r.name.lower() for r in ClockEventReason if r.name and bits & r)
    known = 0
    for reason in ClockEventReason:
        known |= int(reason)
    return ClockEvents(mask=bits, reasons=reasons, unknown_bits=bits & ~known)


# --- sources ------------------------------------------------------------------------------


class MetricsUnavailable(Exception):  # noqa: N818 - a state callers wait out, not a bug
    """A metrics source could not be read; the message says which and why."""


_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")
_NOISE = (
    (re.compile(r" at 0x[0-9a-fA-F]+"), ""),  # an object's address
    (re.compile(r"([?&])time=[0-9.e+-]+"), r"\1time=..."),  # the query's evaluation time
)


def stable_error(err: Exception) -> str:
    """Why a request failed, in words that stay the same from one failed read to the next:
    no object addresses and no query times. A status condition carries it, and a message
    that changed on every read would rewrite the object's status on every resync."""
    if isinstance(err, requests.Timeout):
        return "timed out"
    if isinstance(err, requests.ConnectionError):
        cause = _ERRNO.search(str(err))
        return f"could not connect ({cause.group(0).strip()})" if cause else "could not connect"
    text = str(err)
    for pattern, replacement in _NOISE:
        text = pattern.sub(replacement, text)
    return text


Bucket = tuple[float, float]
"""(upper bound, cumulative count); the last bound is +Inf."""


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


def _le(value: str) -> float:
    return math.inf if value in {"+Inf", "Inf"} else float(value)


def _matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in wanted.items())


def _sum_buckets(samples: Iterable[Sample]) -> list[Bucket]:
    totals: dict[float, float] = {}
    for sample in samples:
        bound = _le(sample.labels["le"])
        totals[bound] = totals.get(bound, 0.0) + sample.value
    return sorted(totals.items())


class PrometheusSource:
    """Reads vLLM and DCGM metrics from a Prometheus server."""

    def __init__(self, url: str, *, timeout: int = 10) -> None:
        # The query client is loaded here, not with the module: what only scrapes an engine's
        # /metrics (a trial's load Job, `tune --local` on a GPU machine) does not need it.
        from prometheus_api_client.prometheus_connect import (  # noqa: PLC0415
            PrometheusConnect,
        )
        from urllib3.util.retry import Retry  # noqa: PLC0415

        self.url = url.rstrip("/")
        # No retries: an unreachable Prometheus is reported at once, the caller retries later.
        self._client = PrometheusConnect(
            url=self.url, timeout=timeout, retry=Retry(total=0, raise_on_status=False)
        )

    def close(self) -> None:
        self._client.close()

    def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        from prometheus_api_client.exceptions import (  # noqa: PLC0415
            PrometheusApiClientException,
        )

        try:
            return call(*args, **kwargs)
        except (requests.RequestException, PrometheusApiClientException, ValueError) as err:
            raise MetricsUnavailable(
                f"Prometheus at {self.url} failed {what}: {stable_error(err)}"
            ) from err

    def check(self) -> None:
        """Raise `MetricsUnavailable` unless a Prometheus query API answers at the URL."""
        result = self._call("a test query", self._client.custom_query, "vector(1)")
        if not isinstance(result, list) or not result:
            raise MetricsUnavailable(
                f"{self.url} answered, but not like a Prometheus query API: {result!r}"
            )

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """An instant query, now or `at` a Unix time; a scalar result comes back as one
        sample without labels."""
        params = {"time": repr(at)} if at is not None else None
        result = self._call(
            f"the query {promql!r}", self._client.custom_query, promql, params=params
        )
        if len(result) == 2 and not isinstance(result[0], dict):  # a scalar: [ts, value]
            return [Sample({}, float(result[1]))]
        return [Sample(dict(item["metric"]), float(item["value"][1])) for item in result]

    def query_value(self, promql: str, at: float | None = None) -> float | None:
        """The single value of an instant query; None for no series or NaN (no data in the
        window). A query that returns several series is a mistake in the query."""
        samples = self.query(promql, at)
        if not samples:
            return None
        if len(samples) > 1:
            raise ValueError(f"{promql!r} returned {len(samples)} series; aggregate it")
        value = samples[0].value
        return None if math.isnan(value) else value

    def histogram_buckets(
        self,
        metric: str,
        selector: Selector = Selector(),
        window: str | None = None,
        at: float | None = None,
    ) -> list[Bucket]:
        """Cumulative bucket counts of a histogram (base name), summed over the selected
        series: the increase over `window`, or the counts since start when None; now, or
        `at` a Unix time."""
        series = f"{metric}_bucket{selector}"
        if window is not None:
            window_seconds(window)
            series = f"increase({series}[{window}])"
        return _sum_buckets(self.query(f"sum by (le) ({series})", at))

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        """Values of a label, optionally only on series matching a selector."""
        params = {"match[]": match} if match is not None else None
        values = self._call(
            f"the values of {label}", self._client.get_label_values, label, params=params
        )
        return sorted(str(v) for v in values)

    def metric_names(self) -> set[str]:
        return set(self.label_values("__name__"))

    def cache_config_info(self, selector: Selector = Selector()) -> dict[str, str]:
        """The labels of `vllm:cache_config_info` (block_size, num_gpu_blocks, …) of the first
        selected engine. The metric has no `model_name` label (vLLM 0.32), so a `model_name`
        matcher is dropped from the selector; select by namespace and pod instead."""
        labels = {k: v for k, v in selector.labels.items() if k != "model_name"}
        regex = {k: v for k, v in selector.regex.items() if k != "model_name"}
        name = METRICS["cache_config"].default
        found = self.query(f"{name}{Selector(labels, regex)}")
        if not found:
            raise MetricsUnavailable(f"Prometheus at {self.url} has no {name}{selector}")
        info = dict(sorted(found, key=lambda s: sorted(s.labels.items()))[0].labels)
        info.pop("__name__", None)
        return info

    def resolve_names(self) -> MetricNames:
        return resolve_names(self.metric_names())

    def workload_fingerprint(
        self,
        window: str,
        selector: Selector = Selector(),
        *,
        percentiles: Sequence[float] = FINGERPRINT_PERCENTILES,
        names: MetricNames = DEFAULT_NAMES,
    ) -> WorkloadFingerprint:
        queries = workload_fingerprint_queries(
            window, selector, percentiles=percentiles, names=names
        )
        values = {key: self.query_value(q) for key, q in queries.items()}
        return WorkloadFingerprint(
            window=window,
            arrival_rate=values["arrival_rate"],
            prompt_mean=values.get("prompt_mean"),
            output_mean=values.get("output_mean"),
            prompt_quantiles={p: values.get(f"prompt_p{p:g}") for p in percentiles},
            output_quantiles={p: values.get(f"output_p{p:g}") for p in percentiles},
        )


@dataclass(frozen=True)
class Exposition:
    """A parsed Prometheus text exposition (one scrape of `/metrics`)."""

    samples: Mapping[str, tuple[Sample, ...]]
    types: Mapping[str, str]

    @classmethod
    def parse(cls, text: str) -> Exposition:
        samples: dict[str, list[Sample]] = {}
        types: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for s in family.samples:
                samples.setdefault(s.name, []).append(Sample(dict(s.labels), float(s.value)))
        return cls({k: tuple(v) for k, v in samples.items()}, types)

    def metric_names(self) -> set[str]:
        """Series names, as Prometheus stores them in `__name__`."""
        return set(self.samples)

    def select(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples.get(name, ()) if _matches(s.labels, labels)]

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of the series of a gauge or counter (full series name, `_total` included)
        whose labels include the given ones; None when none match."""
        found = self.select(name, **labels)
        return sum(s.value for s in found) if found else None

    def histogram_buckets(self, metric: str, **labels: str) -> list[Bucket]:
        """Cumulative bucket counts of a histogram (base name), summed over matching series."""
        return _sum_buckets(self.select(f"{metric}_bucket", **labels))

    def cache_config_info(self, **labels: str) -> dict[str, str]:
        """The labels of `vllm:cache_config_info` (block_size, num_gpu_blocks, …). In vLLM
        0.32 this metric carries `engine` but no `model_name` label."""
        found = self.select(METRICS["cache_config"].default, **labels)
        if not found:
            raise MetricsUnavailable("the exposition has no vllm:cache_config_info")
        return dict(found[0].labels)


class ScrapeSource:
    """Reads an engine's own `/metrics` directly (local runs, no Prometheus)."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url
        self.timeout = timeout

    def scrape(self) -> Exposition:
        if not self.url.startswith(("http://", "https://")):
            raise MetricsUnavailable(f"not an http(s) metrics URL: {self.url}")
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as response:  # noqa: S310 - scheme checked above
                text = response.read().decode()
        except (urllib.error.URLError, OSError) as err:
            raise MetricsUnavailable(f"scraping {self.url} failed: {err}") from err
        try:
            return Exposition.parse(text)
        except ValueError as err:
            raise MetricsUnavailable(f"{self.url} served no Prometheus exposition: {err}") from err

    def value(self, name: str, **labels: str) -> float | None:
        return self.scrape().value(name, **labels)

    def histogram_buckets(self, metric: str, **labels: str) -> list[Bucket]:
        return self.scrape().histogram_buckets(metric, **labels)

    def cache_config_info(self, **labels: str) -> dict[str, str]:
        return self.scrape().cache_config_info(**labels)

    def metric_names(self) -> set[str]:
        return self.scrape().metric_names()

    def resolve_names(self) -> MetricNames:
        return resolve_names(self.metric_names())
