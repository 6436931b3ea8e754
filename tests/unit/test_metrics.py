"""PromQL builders, metric-name resolution, clock-event decoding and the exposition parser,
the last against the real /metrics of vLLM 0.32 (CPU) saved in data/."""

from __future__ import annotations

import math
import re
import socket
from pathlib import Path

import pytest
import requests

from slotune import metrics
from slotune.engine import engine_for
from slotune.metrics import (
    ClockEventReason,
    Exposition,
    Selector,
    dcgm_selector,
    decode_clock_event_reasons,
    model_selector,
    resolve_names,
    window_seconds,
)
from slotune.monitor import live_workload, peak_demand
from support import promql
from support.specs import llm_spec

REAL_EXPOSITION = Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt"
TINY = model_selector(model_name="tiny")


@pytest.fixture(scope="module")
def real() -> Exposition:
    return Exposition.parse(REAL_EXPOSITION.read_text())


# --- selectors and windows ----------------------------------------------------------------


def test_selector_renders_sorted_escaped_matchers() -> None:
    assert Selector().render() == ""
    sel = model_selector(model_name='we"ird\\name', namespace="prod", pod="llm-0")
    assert sel.render() == r'{model_name="we\"ird\\name",namespace="prod",pod="llm-0"}'
    assert Selector({"a": "1"}).with_regex(b="x|y").render() == '{a="1",b=~"x|y"}'


def test_dcgm_selector_uses_exported_labels_when_asked() -> None:
    assert dcgm_selector("ns", "p").render() == '{namespace="ns",pod="p"}'
    assert dcgm_selector("ns", "p", exported=True).render() == (
        '{exported_namespace="ns",exported_pod="p"}'
    )


def test_window_seconds_parses_prometheus_durations_and_refuses_others() -> None:
    assert window_seconds("5m") == 300
    assert window_seconds("1h30m") == 5400
    assert window_seconds("250ms") == pytest.approx(0.25)
    for bad in ["5", "5 m", "m5", "5mx", ""]:
        with pytest.raises(ValueError, match="duration"):
            window_seconds(bad)


# --- vLLM queries -------------------------------------------------------------------------


def test_latency_quantiles_use_the_v1_histograms_and_the_selector() -> None:
    assert promql.latency_quantile("ttft", 95, "5m", TINY) == (
        "histogram_quantile(0.95, sum by (le) "
        '(rate(vllm:time_to_first_token_seconds_bucket{model_name="tiny"}[5m])))'
    )
    assert promql.latency_quantile("tpot", 99.9, "1m", TINY, by=["model_name"]) == (
        "histogram_quantile(0.999, sum by (le, model_name) "
        '(rate(vllm:request_time_per_output_token_seconds_bucket{model_name="tiny"}[1m])))'
    )
    assert "vllm:inter_token_latency_seconds_bucket" in promql.latency_quantile("itl", 50, "5m")
    assert "vllm:e2e_request_latency_seconds_bucket" in promql.latency_quantile("e2e", 50, "5m")
    queue = promql.latency_quantile("queue_time", 90, "5m")
    assert "vllm:request_queue_time_seconds_bucket" in queue
    with pytest.raises(ValueError, match="percentile"):
        promql.latency_quantile("ttft", 100, "5m")
    with pytest.raises(ValueError, match="duration"):
        promql.latency_quantile("ttft", 95, "five minutes")


def test_means_are_the_ratio_of_sum_and_count_rates() -> None:
    assert promql.latency_mean("ttft", "5m", TINY) == (
        'sum (rate(vllm:time_to_first_token_seconds_sum{model_name="tiny"}[5m]))'
        ' / sum (rate(vllm:time_to_first_token_seconds_count{model_name="tiny"}[5m]))'
    )


def test_throughput_and_cache_queries() -> None:
    assert promql.request_throughput("5m", TINY) == (
        'sum (rate(vllm:request_success_total{model_name="tiny"}[5m]))'
    )
    assert promql.request_throughput("5m", TINY, completed_only=True) == (
        'sum (rate(vllm:request_success_total{finished_reason=~"stop|length",'
        'model_name="tiny"}[5m]))'
    )
    assert promql.prompt_token_throughput("5m") == "sum (rate(vllm:prompt_tokens_total[5m]))"
    assert promql.generation_token_throughput("5m", by=["model_name"]) == (
        "sum by (model_name) (rate(vllm:generation_tokens_total[5m]))"
    )
    assert promql.kv_cache_usage_max("5m", TINY) == (
        'max (max_over_time(vllm:kv_cache_usage_perc{model_name="tiny"}[5m]))'
    )
    assert promql.kv_cache_usage(TINY) == 'max (vllm:kv_cache_usage_perc{model_name="tiny"})'
    assert promql.preemption_rate("5m") == "sum (rate(vllm:num_preemptions_total[5m]))"
    assert promql.preemption_increase("10m") == ("sum (increase(vllm:num_preemptions_total[10m]))")
    assert promql.prefix_cache_hit_rate("5m") == (
        "sum (rate(vllm:prefix_cache_hits_total[5m]))"
        " / sum (rate(vllm:prefix_cache_queries_total[5m]))"
    )
    assert promql.requests_running(TINY) == 'sum (vllm:num_requests_running{model_name="tiny"})'
    assert promql.requests_waiting() == "sum (vllm:num_requests_waiting)"


def test_workload_fingerprint_covers_arrivals_and_both_length_distributions() -> None:
    queries = metrics.workload_fingerprint_queries("10m", TINY, percentiles=[50, 99])
    assert set(queries) == {
        "arrival_rate",
        "prompt_mean",
        "output_mean",
        "prompt_p50",
        "prompt_p99",
        "output_p50",
        "output_p99",
    }
    assert queries["prompt_mean"] == (
        'sum (rate(vllm:request_prompt_tokens_sum{model_name="tiny"}[10m]))'
        ' / sum (rate(vllm:request_prompt_tokens_count{model_name="tiny"}[10m]))'
    )
    assert queries["output_p99"].startswith("histogram_quantile(0.99, sum by (le) (rate(")
    assert "vllm:request_generation_tokens_bucket" in queries["output_p99"]
    arrivals = queries["arrival_rate"]
    # finished + change in the engine's queue, per second of the window, + turned away
    assert 'rate(vllm:request_success_total{model_name="tiny"}[10m])' in arrivals
    assert 'delta(vllm:num_requests_waiting{model_name="tiny"}[10m])' in arrivals
    assert "/ 600" in arrivals
    assert "or vector(0)" in arrivals


# --- names across versions ----------------------------------------------------------------


def test_resolution_prefers_the_newest_exposed_name() -> None:
    old = resolve_names(
        {
            "vllm:gpu_cache_usage_perc",
            "vllm:time_per_output_token_seconds_bucket",
            "DCGM_FI_DEV_BOARD_POWER_WATTS",
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        }
    )
    assert old["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    assert old["tpot"] == "vllm:time_per_output_token_seconds"
    assert old["gpu_power"] == "DCGM_FI_DEV_BOARD_POWER_WATTS"
    assert old["gpu_clock_event_reasons"] == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    assert promql.kv_cache_usage(names=old) == "max (vllm:gpu_cache_usage_perc)"
    assert "vllm:time_per_output_token_seconds_bucket" in promql.latency_quantile(
        "tpot", 95, "5m", names=old
    )

    both = resolve_names(
        {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "DCGM_FI_DEV_POWER_USAGE"}
    )
    assert both["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert both["gpu_power"] == "DCGM_FI_DEV_POWER_USAGE"
    assert "ttft" in both.missing  # not exposed: keeps the newest name
    assert both["ttft"] == "vllm:time_to_first_token_seconds"


def test_the_real_vllm_032_exposition_resolves_to_the_newest_names(real: Exposition) -> None:
    names = resolve_names(real.metric_names())
    assert names["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert names["tpot"] == "vllm:request_time_per_output_token_seconds"
    # The speculative-decoding counters appear only on an engine that decodes speculatively.
    only_speculative = {"spec_decode_drafted", "spec_decode_accepted"}
    vllm_signals = {k for k in metrics.METRICS if not k.startswith("gpu_")} - only_speculative
    assert names.missing == {k for k in metrics.METRICS if k.startswith("gpu_")} | only_speculative
    assert vllm_signals.isdisjoint(names.missing)


# --- DCGM ---------------------------------------------------------------------------------


def test_clock_event_bitmask_decodes_to_reason_names() -> None:
    idle = decode_clock_event_reasons(1.0)
    assert idle.reasons == ("gpu_idle",)
    assert not idle.throttled
    hot = decode_clock_event_reasons(float(0x20 | 0x40 | 0x4))
    assert hot.reasons == ("power_cap", "sw_thermal", "hw_thermal")
    assert hot.throttled
    assert hot.thermal
    assert hot.power
    brake = decode_clock_event_reasons(0x80)
    assert brake.power
    assert not brake.thermal
    assert decode_clock_event_reasons(0).reasons == ()
    assert decode_clock_event_reasons(0x1000 | 0x8).unknown_bits == 0x1000
    assert ClockEventReason.DISPLAY_CLOCKS == 0x100
    with pytest.raises(ValueError, match="bitmask"):
        decode_clock_event_reasons(1.5)


def test_gpu_queries() -> None:
    sel = dcgm_selector("prod", "llm-0")
    assert promql.gpu_sm_clock(sel) == (
        'max by (gpu, UUID) (DCGM_FI_DEV_SM_CLOCK{namespace="prod",pod="llm-0"})'
    )
    # Unresolved names: DCGM_FI_DEV_MAX_SM_CLOCK is not in the default CSV.
    assert promql.gpu_sm_clock_ratio(sel, max_window="6h") == (
        'max by (gpu, UUID) (DCGM_FI_DEV_SM_CLOCK{namespace="prod",pod="llm-0"})'
        " / max by (gpu, UUID) "
        '(max_over_time(DCGM_FI_DEV_SM_CLOCK{namespace="prod",pod="llm-0"}[6h]))'
    )
    with_max = resolve_names({"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MAX_SM_CLOCK"})
    assert promql.gpu_sm_clock_ratio(names=with_max) == (
        "max by (gpu, UUID) (DCGM_FI_DEV_SM_CLOCK) / max by (gpu, UUID) (DCGM_FI_DEV_MAX_SM_CLOCK)"
    )
    assert promql.gpu_clock_event_reasons() == (
        "max by (gpu, UUID) (DCGM_FI_DEV_CLOCKS_EVENT_REASONS)"
    )
    assert promql.gpu_framebuffer_used(by=["gpu"]) == "max by (gpu) (DCGM_FI_DEV_FB_USED)"
    assert promql.gpu_temperature() == "max by (gpu, UUID) (DCGM_FI_DEV_GPU_TEMP)"
    assert promql.gpu_power() == "max by (gpu, UUID) (DCGM_FI_DEV_POWER_USAGE)"


# --- the exposition parser, on the real vLLM 0.32 /metrics ---------------------------------


def test_real_exposition_values_and_labels(real: Exposition) -> None:
    assert real.value("vllm:request_success_total", model_name="tiny") == 1.0
    assert real.value("vllm:request_success_total", finished_reason="length") == 1.0
    assert real.value("vllm:request_success_total", finished_reason="stop") == 0.0
    assert real.value("vllm:request_success_total", model_name="other") is None
    assert real.value("vllm:kv_cache_usage_perc", engine="0") == 0.0
    assert real.value("vllm:generation_tokens_total") == 16.0
    assert real.value("vllm:prefix_cache_queries_total") == 8.0
    assert real.types["vllm:time_to_first_token_seconds"] == "histogram"
    assert real.types["vllm:request_success"] == "counter"


def test_real_exposition_histogram_buckets_are_cumulative_with_inf(real: Exposition) -> None:
    ttft = real.histogram_buckets("vllm:time_to_first_token_seconds", model_name="tiny")
    assert [b for b, _ in ttft][:3] == [0.001, 0.005, 0.01]
    assert ttft[-1] == (math.inf, 1.0)
    counts = [c for _, c in ttft]
    assert counts == sorted(counts)
    # The single request's TTFT was 0.041 s: first counted at the 0.06 bound.
    assert dict(ttft)[0.04] == 0.0
    assert dict(ttft)[0.06] == 1.0
    prompt = real.histogram_buckets("vllm:request_prompt_tokens")
    assert [b for b, _ in prompt][-2:] == [2000.0, math.inf]
    assert real.histogram_buckets("vllm:no_such_histogram") == []


def test_real_exposition_cache_config_info(real: Exposition) -> None:
    # The info metric has engine but no model_name label.
    assert real.select("vllm:cache_config_info", model_name="tiny") == []
    info = real.cache_config_info(engine="0")
    assert info["block_size"] == "128"
    assert info["num_gpu_blocks"] == "4096"
    assert info["kv_cache_size_tokens"] == "524288"
    assert info["enable_prefix_caching"] == "True"
    with pytest.raises(metrics.MetricsUnavailable, match="cache_config_info"):
        Exposition.parse("up 1\n").cache_config_info()


def test_a_prometheus_that_refuses_connections_gets_the_same_message_every_read() -> None:
    # A real client against a port nobody listens on. The condition's message must not change
    # between reads (no object address, no query time), or every resync rewrites the status.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    source = metrics.PrometheusSource(f"http://127.0.0.1:{port}", timeout=2)
    messages = []
    for at in (1_700_000_000.5, 1_700_000_042.25):
        with pytest.raises(metrics.MetricsUnavailable) as raised:
            source.query("vllm:num_requests_running", at=at)
        messages.append(str(raised.value))
    source.close()
    assert messages[0] == messages[1]
    assert "could not connect ([Errno 111] Connection refused)" in messages[0]
    assert "0x" not in messages[0]
    assert "1700000" not in messages[0]


def test_stable_error_drops_addresses_and_query_times_from_other_failures() -> None:
    text = "bad response for /api/v1/query?query=up&time=1700000000.5 from <Thing at 0x7f3a9c>"
    assert metrics.stable_error(ValueError(text)) == (
        "bad response for /api/v1/query?query=up&time=... from <Thing>"
    )
    assert metrics.stable_error(requests.ReadTimeout("read timed out at 0x1")) == "timed out"


class _Recorder:
    """A Prometheus that answers every query with `value` and keeps the queries it was sent."""

    def __init__(self, value: float | None = 1.0) -> None:
        self.queries: list[str] = []
        self.value = value

    def query_value(self, query: str, at: float | None = None) -> float | None:
        self.queries.append(query)
        return self.value


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_demand_and_the_live_workload_are_read_by_the_engines_own_metric_names(kind: str) -> None:
    """Scaling's peak demand and the live workload's fingerprint query the series of the
    deployment's engine, named by its adapter: an SGLang deployment is not read by vLLM's."""
    image = "lmsysorg/sglang:v0.5.5" if kind == "sglang" else "vllm/vllm-openai:v0.32.0"
    spec = llm_spec(engine={"kind": kind, "image": image})
    engine = engine_for(kind)
    source = _Recorder()
    assert peak_demand(source, spec, "ns", "chat") == 1.0  # type: ignore[arg-type]
    live_workload(source, spec, "ns", "chat")  # type: ignore[arg-type]
    sent = " ".join(source.queries)
    for signal in ("request_success", "requests_running", "requests_waiting"):
        assert engine.metrics[signal][0] in sent, signal
    prefix = "vllm:" if kind == "sglang" else "sglang:"
    other_engines = [
        name for name in re.findall(r"[a-z]+:[a-z_]+", sent) if name.startswith(prefix)
    ]
    assert other_engines == [], other_engines
