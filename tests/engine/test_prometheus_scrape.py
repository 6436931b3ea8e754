"""slotune's metric sources against the real thing: vLLM 0.32 (CPU) scraped every second by a
real Prometheus. What `PrometheusSource` reads must be what vLLM's own /metrics shows.

The tests share one engine and run in file order: the first ones send requests of one shape
(5 prompt tokens, 8 output tokens) so the workload fingerprint is exact; the KV-cache test,
with its long request, comes last.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from slotune.metrics import (
    MetricsUnavailable,
    PrometheusSource,
    ScrapeSource,
    model_selector,
)
from slotune.models import LLMDeploymentSpec
from slotune.monitor import live_workload
from slotune.slo.histogram import histogram_quantile, judge_histogram
from support import promql
from support.engine import ScrapedEngine
from support.prometheus import PrometheusServer

pytestmark = pytest.mark.engine

PROMPT = [1, 2, 3, 4, 5]
OUTPUT_TOKENS = 8
TTFT = "vllm:time_to_first_token_seconds"
HOLD_S = 4.0
"""KV blocks held for four 1 s scrape intervals, so several scrapes land inside a request."""
HOLD_DEADLINE_S = 120.0
"""How long requests go on for the engine and Prometheus to show blocks held."""


@pytest.fixture
def source(prometheus: PrometheusServer) -> Iterator[PrometheusSource]:
    src = PrometheusSource(prometheus.url)
    src.check()
    yield src
    src.close()


@pytest.fixture
def scrape(scraped_vllm: ScrapedEngine) -> ScrapeSource:
    return ScrapeSource(f"{scraped_vllm.url}/metrics")


def eventually(read: Callable[[], float | None], want: float, timeout: float = 20) -> float:
    """Poll until Prometheus has scraped a value; return the last one read."""
    deadline = time.monotonic() + timeout
    value = read()
    while value != want and time.monotonic() < deadline:
        time.sleep(0.5)
        value = read()
    assert value == want
    return value


def test_request_success_increase_matches_the_engine(
    scraped_vllm: ScrapedEngine, source: PrometheusSource, scrape: ScrapeSource
) -> None:
    tiny = model_selector(model_name="tiny")
    total = f"sum(vllm:request_success_total{tiny})"
    before = scrape.value("vllm:request_success_total", model_name="tiny")
    assert before is not None
    eventually(lambda: source.query_value(total), before)
    t_before = time.time()

    requests = 4
    for _ in range(requests):
        scraped_vllm.complete(PROMPT, OUTPUT_TOKENS)

    after = scrape.value("vllm:request_success_total", model_name="tiny")
    assert after == before + requests
    eventually(lambda: source.query_value(total), after)
    assert source.query_value(total, at=t_before) == before
    length = source.query_value(
        f"sum(vllm:request_success_total{tiny.with_labels(finished_reason='length')})"
    )
    assert length == scrape.value("vllm:request_success_total", finished_reason="length")


def test_workload_fingerprint_and_latency_queries_run_on_real_data(
    source: PrometheusSource, scrape: ScrapeSource
) -> None:
    tiny = model_selector(model_name="tiny")
    names = source.resolve_names()
    assert names["tpot"] == "vllm:request_time_per_output_token_seconds"
    assert names["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert {"ttft", "tpot", "itl", "e2e", "request_success"}.isdisjoint(names.missing)

    fingerprint = source.workload_fingerprint("1m", tiny, names=names)
    # Every request so far had the same shape, so the sum/count ratios are exact.
    assert fingerprint.prompt_mean == pytest.approx(len(PROMPT))
    assert fingerprint.output_mean == pytest.approx(OUTPUT_TOKENS)
    p50 = fingerprint.output_quantiles[50]
    assert p50 is not None
    assert 5 < p50 <= 10  # interpolated inside vLLM's (5, 10] token bucket
    assert fingerprint.arrival_rate is not None
    assert fingerprint.arrival_rate > 0

    for signal in ("ttft", "tpot", "itl", "e2e", "queue_time"):
        p95 = source.query_value(promql.latency_quantile(signal, 95, "1m", tiny, names=names))
        mean = source.query_value(promql.latency_mean(signal, "1m", tiny, names=names))
        assert p95 is not None, signal
        assert mean is not None, signal
        assert 0 <= mean <= 60, signal
    throughput = source.query_value(promql.request_throughput("1m", tiny, completed_only=True))
    assert throughput is not None
    assert throughput > 0
    tokens = source.query_value(promql.generation_token_throughput("1m", tiny))
    assert tokens is not None
    assert tokens > 0
    assert source.query_value(promql.preemption_increase("1m", tiny)) == 0
    assert source.query_value(promql.requests_waiting(tiny)) == 0
    hit_rate = source.query_value(promql.prefix_cache_hit_rate("1m", tiny))
    assert hit_rate is not None
    assert 0 <= hit_rate <= 1

    # A Live workload: trials shaped like this traffic (no namespace label on this target).
    live_spec = LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "tiny"},
            "slo": {"ttft": {"maxSeconds": 2.0}, "window": "1m"},
            "tuning": {"enabled": True, "workload": {"source": "Live", "duration": "20s"}},
        }
    )
    live = live_workload(source, live_spec, "", "tiny")
    assert live is not None
    assert live.source == "Synthetic"
    assert live.prompt_tokens is not None
    assert live.prompt_tokens.mean == len(PROMPT)
    assert live.output_tokens is not None
    assert live.output_tokens.mean == OUTPUT_TOKENS
    assert live.request_rate is not None
    assert live.request_rate > 0
    assert live.duration == "20s"


def test_custom_ttft_bounds_reach_prometheus_and_decide_the_slo(
    source: PrometheusSource, scrape: ScrapeSource
) -> None:
    tiny = model_selector(model_name="tiny")
    engine_buckets = scrape.histogram_buckets(TTFT, model_name="tiny")
    bounds = [b for b, _ in engine_buckets]
    assert 2.0 in bounds  # not a vLLM default; there from --custom-histogram-buckets
    assert {1.6, 1.8, 2.2} <= set(bounds)

    count = engine_buckets[-1][1]
    eventually(lambda: source.query_value(f"sum({TTFT}_count{tiny})"), count)
    stored = {s.labels["le"] for s in source.query(f"{TTFT}_bucket{tiny}")}
    assert "2.0" in stored  # the series le="2.0", as prometheus_client writes the bound
    assert source.histogram_buckets(TTFT, tiny) == engine_buckets

    verdict = judge_histogram(source.histogram_buckets(TTFT, tiny), 95, 2.0)
    assert verdict.resolvable
    assert verdict.met is True  # a 5-token prompt on a tiny model is far below 2 s
    promql_p95 = source.query_value(f"histogram_quantile(0.95, sum by (le) ({TTFT}_bucket{tiny}))")
    assert promql_p95 is not None
    assert histogram_quantile(95, engine_buckets) == pytest.approx(promql_p95, rel=1e-9)
    windowed = source.histogram_buckets(TTFT, tiny, window="1m")
    assert windowed[-1][0] == math.inf
    assert windowed[-1][1] > 0


def test_cache_config_info_matches_the_engine(
    source: PrometheusSource, scrape: ScrapeSource
) -> None:
    from_engine = scrape.cache_config_info()
    from_prometheus = source.cache_config_info(model_selector(model_name="tiny"))
    assert from_prometheus["block_size"] == from_engine["block_size"] == "128"  # CPU default
    assert from_prometheus["num_gpu_blocks"] == from_engine["num_gpu_blocks"]
    assert from_prometheus["job"] == "vllm"  # target labels added by the scrape
    blocks = source.label_values("num_gpu_blocks", match="vllm:cache_config_info")
    assert blocks == [from_engine["num_gpu_blocks"]]


def test_kv_cache_usage_peak_of_a_long_request(
    scraped_vllm: ScrapedEngine, source: PrometheusSource, scrape: ScrapeSource
) -> None:
    tiny = model_selector(model_name="tiny")
    info = scrape.cache_config_info()
    block_size, blocks = int(info["block_size"]), int(info["num_gpu_blocks"])
    output_tokens = 1024
    done = threading.Event()
    seen: list[float] = []
    failures: list[Exception] = []

    def watch() -> None:
        while not done.is_set():
            try:
                value = scrape.value("vllm:kv_cache_usage_perc", model_name="tiny")
            except MetricsUnavailable as error:  # a slow answer under load: try again
                failures.append(error)
            else:
                seen.append(value or 0.0)
            time.sleep(0.2)

    def prometheus_saw_blocks() -> bool:
        return bool(source.query_value(promql.kv_cache_usage_max("1m", tiny)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # One request at a time, for at least HOLD_S and until both the engine's own /metrics
        # and Prometheus have shown blocks held: a single 1024-token decode can finish between
        # two 1 s scrapes on a fast machine, and a busy one can answer /metrics slowly.
        started = time.monotonic()
        while time.monotonic() - started < HOLD_S or not (
            max(seen, default=0.0) > 0 and prometheus_saw_blocks()
        ):
            assert time.monotonic() - started < HOLD_DEADLINE_S, (
                f"after {HOLD_DEADLINE_S:g} s of requests the engine's own /metrics showed"
                f" {sorted(set(seen))} ({len(failures)} reads failed: {failures[-1:]}) and"
                f" Prometheus saw blocks: {prometheus_saw_blocks()}"
            )
            scraped_vllm.complete(PROMPT, output_tokens)
    finally:
        done.set()
        watcher.join()
    time.sleep(2.5)  # two more scrapes

    peak = source.query_value(promql.kv_cache_usage_max("1m", tiny))
    most_blocks = math.ceil((len(PROMPT) + output_tokens) / block_size)
    assert peak is not None
    # A fraction of the usable blocks (vLLM: 1 - free / (num_gpu_blocks - 1)), not a percent.
    assert 1 / (blocks - 1) <= peak <= most_blocks / (blocks - 1) + 1e-12
    assert max(seen) <= most_blocks / (blocks - 1) + 1e-12
    # Idle again: Prometheus and the engine agree on the current value.
    now = scrape.value("vllm:kv_cache_usage_perc", model_name="tiny")
    eventually(lambda: source.query_value(promql.kv_cache_usage(tiny)), now or 0.0)


def test_unreachable_sources_say_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MetricsUnavailable, match=f"127.0.0.1:{port}"):
        PrometheusSource(f"http://127.0.0.1:{port}", timeout=2).check()
    with pytest.raises(MetricsUnavailable, match="scraping"):
        ScrapeSource(f"http://127.0.0.1:{port}/metrics", timeout=2).scrape()
