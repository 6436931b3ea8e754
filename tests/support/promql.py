"""PromQL for vLLM's and the DCGM exporter's series, as the tests read them.

The operator's own queries are few (on-call's request rate, histograms and GPU readings, the
live workload's fingerprint); these builders cover the rest of what an engine exposes, so the
engine tests (tests/engine) can check every metric name slotune relies on against a real vLLM
scraped by a real Prometheus. Built on `slotune.metrics`' shapes and names.
"""

from __future__ import annotations

from collections.abc import Sequence

from slotune.metrics import (
    DEFAULT_NAMES,
    LatencySignal,
    MetricNames,
    Selector,
    counter_rate_query,
    group_by,
    histogram_mean_query,
    histogram_quantile_query,
    window_seconds,
)


def counter_increase_query(
    metric: str, window: str, selector: Selector = Selector(), by: Sequence[str] = ()
) -> str:
    window_seconds(window)
    return f"sum{group_by(by)} (increase({metric}{selector}[{window}]))"


def latency_quantile(
    signal: LatencySignal,
    percentile: float,
    window: str,
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """pN of TTFT, TPOT, ITL, e2e, queue, prefill or decode time, in seconds."""
    return histogram_quantile_query(names[signal], percentile, window, selector, by)


def latency_mean(
    signal: LatencySignal,
    window: str,
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    return histogram_mean_query(names[signal], window, selector, by)


def request_throughput(
    window: str,
    selector: Selector = Selector(),
    *,
    completed_only: bool = False,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """Finished requests per second; `completed_only` leaves out aborts and errors."""
    if completed_only:
        selector = selector.with_regex(finished_reason="stop|length")
    return counter_rate_query(names["request_success"], window, selector, by)


def prompt_token_throughput(
    window: str,
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """Prefill tokens per second, cached ones included."""
    return counter_rate_query(names["prompt_tokens"], window, selector, by)


def generation_token_throughput(
    window: str,
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    return counter_rate_query(names["generation_tokens"], window, selector, by)


def kv_cache_usage(
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """KV cache in use now, a fraction 0-1; the fullest replica."""
    return f"max{group_by(by)} ({names['kv_cache_usage']}{selector})"


def kv_cache_usage_max(
    window: str,
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """The highest KV cache use (0-1) over a window, the fullest replica."""
    window_seconds(window)
    return f"max{group_by(by)} (max_over_time({names['kv_cache_usage']}{selector}[{window}]))"


def preemption_rate(
    window: str,
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    return counter_rate_query(names["preemptions"], window, selector, by)


def preemption_increase(
    window: str,
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    return counter_increase_query(names["preemptions"], window, selector, by)


def prefix_cache_hit_rate(
    window: str,
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """Token-weighted prefix-cache hit rate, 0-1 (NaN with no queries in the window)."""
    return (
        f"{counter_rate_query(names['prefix_cache_hits'], window, selector, by)}"
        f" / {counter_rate_query(names['prefix_cache_queries'], window, selector, by)}"
    )


def requests_running(
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    return f"sum{group_by(by)} ({names['requests_running']}{selector})"


def requests_waiting(
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = (),
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    return f"sum{group_by(by)} ({names['requests_waiting']}{selector})"


GPU_LABELS: tuple[str, ...] = ("gpu", "UUID")


def gpu_sm_clock(
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = GPU_LABELS,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """SM clock now, MHz, per GPU."""
    return f"max{group_by(by)} ({names['gpu_sm_clock']}{selector})"


def gpu_sm_clock_ratio(
    selector: Selector = Selector(),
    *,
    max_window: str = "1h",
    by: Sequence[str] = GPU_LABELS,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """SM clock as a fraction of its maximum, per GPU. The maximum is
    `DCGM_FI_DEV_MAX_SM_CLOCK` when resolved names show the exporter exposes it (it is not in
    the default CSV), else the highest clock seen over `max_window`. An idle GPU also clocks
    down, so read this together with the clock-event reasons."""
    clock = f"max{group_by(by)} ({names['gpu_sm_clock']}{selector})"
    if not names.exposes("gpu_max_sm_clock"):
        window_seconds(max_window)
        ceiling = (
            f"max{group_by(by)} (max_over_time({names['gpu_sm_clock']}{selector}[{max_window}]))"
        )
    else:
        ceiling = f"max{group_by(by)} ({names['gpu_max_sm_clock']}{selector})"
    return f"{clock} / {ceiling}"


def gpu_clock_event_reasons(
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = GPU_LABELS,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """The clock-event bitmask per GPU; decode each value with `decode_clock_event_reasons`.
    (Not in the exporter's default CSV.) Bitmasks do not aggregate, so `by` should name the
    GPU."""
    return f"max{group_by(by)} ({names['gpu_clock_event_reasons']}{selector})"


def gpu_framebuffer_used(
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = GPU_LABELS,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """Framebuffer memory in use, MiB, per GPU."""
    return f"max{group_by(by)} ({names['gpu_fb_used']}{selector})"


def gpu_temperature(
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = GPU_LABELS,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """GPU temperature, °C, per GPU."""
    return f"max{group_by(by)} ({names['gpu_temperature']}{selector})"


def gpu_power(
    selector: Selector = Selector(),
    *,
    by: Sequence[str] = GPU_LABELS,
    names: MetricNames = DEFAULT_NAMES,
) -> str:
    """Power draw, W, per GPU."""
    return f"max{group_by(by)} ({names['gpu_power']}{selector})"
