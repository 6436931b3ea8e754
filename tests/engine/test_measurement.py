"""The numbers slotune judges SLOs by are right: what Prometheus derives from vLLM's metrics
agrees with what the load generator saw, within what vLLM's histograms can resolve.

A seeded open-loop Poisson run drives the shared engine, which Prometheus scrapes every
second. A second engine then starts with `--custom-histogram-buckets` centred on the TTFT p95
that run measured, and with a KV cache of a few dozen blocks: it replays the run to judge an
SLO at its bound, then takes a burst that must preempt.

Each run is framed by two moments at which Prometheus had scraped the idle engine (`Frame`).
Counts over the run are the difference of Prometheus' cumulative series at those moments:
exact, where `increase()` extrapolates to the window's edges (101 requests read as ~104). The
PromQL the operator sends (rates over a window) is checked against those exact counts.

Client and server measure slightly different intervals. vLLM starts a request's clock when
its frontend has parsed the HTTP request, and stops the TTFT clock when the frontend's output
loop takes the first token from the engine core; the client's TTFT also holds sending the
request, the SSE write and its own event loop. So each client TTFT is at least the server's
and exceeds it by the client-side overhead, a few milliseconds, bounded here by
`CLIENT_OVERHEAD_S`. TPOT spreads that overhead's jitter over `OUTPUT_TOKENS - 1` tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

from slotune import metrics
from slotune.loadgen import RequestResult, Workload, plan_requests, run_workload, summarize
from slotune.metrics import (
    Exposition,
    PrometheusSource,
    ScrapeSource,
    WorkloadFingerprint,
    vllm_selector,
)
from slotune.models import EngineArgs, SloSpec, SloTarget
from slotune.runtime import EngineConfig
from slotune.runtime.local import LocalEngine, LocalRuntime
from slotune.slo import (
    custom_histogram_buckets,
    evaluate_samples,
    histogram_quantile,
    judge_histogram,
)
from slotune.stats import mean, percentile
from support.engine import TINY_MODEL
from support.prometheus import PrometheusServer, prometheus_binary

pytestmark = pytest.mark.engine

SERVED = "tiny"
TINY = vllm_selector(model_name=SERVED)
OUTPUT_TOKENS = 32
MEASURED = Workload(
    num_requests=101,
    seed=11,
    rate=3.0,
    prompt_tokens=608,
    prompt_spread=0.6,  # 243-972 tokens
    output_tokens=OUTPUT_TOKENS,
)
"""101 requests: with N - 1 a multiple of 100, the exact p50/p90/p95/p99 of N samples (linear
interpolation) is one order statistic, the one whose bucket `histogram_quantile` interpolates
in (rank q * N), so the exact value and the bucket speak of the same request. About 35 s at
3 requests/s: queues form (TTFT p95 about twice p50) without the engine falling behind."""

SLO_RUN = dataclasses.replace(MEASURED, num_requests=61)
"""The first 61 requests of the measured run (same seed: same lengths and arrival times)."""

WARMUP = dataclasses.replace(MEASURED, num_requests=6, seed=99, rate=None, concurrency=2)
"""Sent before a frame opens, so first-request effects stay out of the measurement. Of the
measured shape, so that on a fresh engine no counter starts the window near zero: rate() stops
extrapolating a counter at its zero point, so a young `_sum` would be scaled differently from
its `_count` and bias the fingerprint's means."""

BURST = Workload(
    num_requests=16, seed=5, rate=math.inf, prompt_tokens=512, prompt_spread=0.25, output_tokens=256
)
"""All at once, 6 KV blocks each when done: 96 blocks wanted of the small engine's 48."""

SMALL_KV_BYTES = 48 * 128 * 2048
"""48 blocks of 128 tokens at 2 KiB a token (4 layers x K,V x 4 heads x 32 dims x fp16): room
for six full-length requests, so a Poisson run rarely preempts and the burst must."""

CLIENT_OVERHEAD_S = 0.1
"""The most the client-side part of a TTFT (HTTP, SSE, the generator's event loop) may add to
the server's. Typically 4-8 ms; the bound leaves room for the generator being starved of CPU
on two cores shared with the engine (and, at times, with another engine)."""

TPOT_SLACK_S = CLIENT_OVERHEAD_S / (OUTPUT_TOKENS - 1)
"""Client and server TPOT differ by the jitter of that overhead spread over the decode."""

KV_HOLDERS = Workload(num_requests=24, seed=3, concurrency=2, prompt_tokens=600, output_tokens=400)
"""Two at a time, about 2 s each: KV blocks held for about 24 s. 12 requests gave from 1 to 7
comparable scrapes on two cores; twice as long a hold gives twice the chances."""

SCRAPE_TAKES_S = 0.1
"""More than Prometheus needs to read the engine's /metrics (about 10 ms)."""

OVERHEAD_SPREAD = 4.0
"""A request's client overhead stays within this many times the run's mean (the generator's
timing error, bench/loadgen_overhead.py, is a floor of about 1 ms plus scheduling delays of a
few ms; its p99 stays within a few times its mean on two cores)."""
MIN_OVERHEAD_S = 0.005
START_TIMEOUT = 300.0

TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
PROMPT_TOKENS = "vllm:request_prompt_tokens"
OUTPUT_TOKENS_HIST = "vllm:request_generation_tokens"
KV_USAGE = "vllm:kv_cache_usage_perc"
Bucket = tuple[float, float]


# --- framing a run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """A run between two idle moments that Prometheus had scraped; wall-clock seconds."""

    started: float
    ended: float
    before: Exposition  # the engine's own /metrics at `started`
    after: Exposition  # and at `ended`

    @property
    def window_s(self) -> int:
        """A PromQL window ending at `ended` that holds the run and one idle scrape before
        it (so rate() sees every change), and no earlier traffic (see `framed`)."""
        return math.ceil(self.ended - self.started) + 1

    @property
    def window(self) -> str:
        return f"{self.window_s}s"

    def engine_delta(self, name: str) -> float:
        after = self.after.value(name, model_name=SERVED)
        before = self.before.value(name, model_name=SERVED)
        assert after is not None
        return after - (before or 0.0)

    def engine_buckets(self, metric: str) -> list[Bucket]:
        before = dict(self.before.histogram_buckets(metric, model_name=SERVED))
        return [
            (bound, count - before.get(bound, 0.0))
            for bound, count in self.after.histogram_buckets(metric, model_name=SERVED)
        ]


@dataclass
class Engine:
    """An engine with the Prometheus that scrapes it, as the tests read it."""

    url: str
    prometheus: PrometheusServer
    source: PrometheusSource
    scrape: ScrapeSource


def caught_up(engine: Engine) -> tuple[float, Exposition]:
    """Waits until Prometheus' latest scrape shows the engine's request and token counters,
    which move together with the histograms; returns that moment and the exposition."""
    counters = ("vllm:request_success_total", "vllm:generation_tokens_total")
    deadline = time.monotonic() + 30
    while True:
        exposition = engine.scrape.scrape()
        want = [exposition.value(name, model_name=SERVED) for name in counters]
        seen = [engine.source.query_value(f"sum({name}{TINY})") for name in counters]
        if seen == want:
            return time.time(), exposition
        assert time.monotonic() < deadline, f"Prometheus shows {seen}, the engine {want}"
        time.sleep(0.25)


def framed(engine: Engine, run: Callable[[], object]) -> Frame:
    caught_up(engine)
    # Two idle seconds: the window of `Frame.window_s` opens after any earlier traffic.
    time.sleep(2.0)
    started, before = time.time(), engine.scrape.scrape()
    run()
    ended, after = caught_up(engine)
    return Frame(started, ended, before, after)


def send(engine: Engine, workload: Workload) -> list[RequestResult]:
    results = asyncio.run(run_workload(engine.url, SERVED, workload))
    failed = [r.error for r in results if not r.ok]
    assert not failed, failed
    return results


def prometheus_value(engine: Engine, name: str, at: float) -> float:
    value = engine.source.query_value(f"sum({name}{TINY})", at=at)
    assert value is not None, name
    return value


def prometheus_delta(engine: Engine, name: str, frame: Frame) -> float:
    return prometheus_value(engine, name, frame.ended) - prometheus_value(
        engine, name, frame.started
    )


def prometheus_buckets(engine: Engine, metric: str, frame: Frame) -> list[Bucket]:
    """Bucket counts over the run from Prometheus: cumulative counts at the end minus those
    at the start."""

    def at(moment: float) -> dict[float, float]:
        samples = engine.source.query(f"sum by (le) ({metric}_bucket{TINY})", at=moment)
        return {float(s.labels["le"]): s.value for s in samples}

    before, after = at(frame.started), at(frame.ended)
    return sorted((bound, count - before.get(bound, 0.0)) for bound, count in after.items())


def rank_bucket(buckets: Sequence[Bucket], p: float) -> tuple[float, float]:
    """(lower, upper] bounds of the bucket holding the p-th percentile's rank, the bucket
    `histogram_quantile` interpolates in."""
    total = buckets[-1][1]
    lower = 0.0
    for bound, count in buckets:
        if count >= p / 100 * total:
            return lower, bound
        lower = bound
    raise AssertionError(f"no bucket reaches rank {p}% of {total}")


def bucket_of(value: float, bounds: Sequence[float]) -> tuple[float, float]:
    """(lower, upper] bounds of the bucket a value falls in."""
    lower = 0.0
    for bound in sorted(bounds):
        if value <= bound:
            return lower, bound
        lower = bound
    raise AssertionError(f"{value} is above every bound")


def count_at_most(values: Sequence[float], bound: float) -> int:
    return sum(v <= bound for v in values)


def ttfts(results: Sequence[RequestResult]) -> list[float]:
    return [r.ttft for r in results if r.ttft is not None]


def tpots(results: Sequence[RequestResult]) -> list[float]:
    return [r.tpot for r in results if r.tpot is not None]


# --- the engines --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(scraped_vllm: LocalEngine, prometheus: PrometheusServer) -> Iterator[Engine]:
    source = PrometheusSource(prometheus.url)
    yield Engine(
        scraped_vllm.base_url,
        prometheus,
        source,
        ScrapeSource(f"{scraped_vllm.base_url}/metrics"),
    )
    source.close()


@dataclass(frozen=True)
class Measurement:
    results: list[RequestResult]
    frame: Frame
    fingerprint: WorkloadFingerprint  # read as soon as the run ended


@pytest.fixture(scope="module")
def measured(shared: Engine) -> Measurement:
    send(shared, WARMUP)
    results: list[RequestResult] = []
    frame = framed(shared, lambda: results.extend(send(shared, MEASURED)))
    # The fingerprint queries are evaluated "now": read them while the window is the run.
    fingerprint = shared.source.workload_fingerprint(frame.window, TINY)
    return Measurement(results, frame, fingerprint)


@dataclass(frozen=True)
class SloEngine:
    engine: Engine
    slo: SloSpec


@pytest.fixture(scope="module")
def slo_engine(
    measured: Measurement, engine_runtime: LocalRuntime, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SloEngine]:
    # The threshold is the p95 the shared engine measured for the same requests (the first
    # 61 of the measured run), to the millisecond.
    same_requests = measured.results[: SLO_RUN.num_requests]
    threshold = round(percentile(ttfts(same_requests), 95), 3)
    slo = SloSpec(ttft=SloTarget(percentile=95, max_seconds=threshold))
    config = EngineConfig(
        model=str(TINY_MODEL),
        served_name=SERVED,
        args=EngineArgs(max_model_len=1024),
        extra_args=(
            "--custom-histogram-buckets",
            custom_histogram_buckets(slo),
            "--kv-cache-memory-bytes",
            str(SMALL_KV_BYTES),
        ),
        env=(),  # VLLM_CPU_KVCACHE_SPACE would override --kv-cache-memory-bytes
    )
    engine = engine_runtime.start(config, timeout=START_TIMEOUT)
    try:
        with PrometheusServer(
            prometheus_binary(install=True),
            tmp_path_factory.mktemp("prometheus-slo"),
            [f"127.0.0.1:{engine.port}"],
            scrape_interval="1s",
        ) as server:
            server.wait_for_target_up()
            source = PrometheusSource(server.url)
            yield SloEngine(
                Engine(engine.base_url, server, source, ScrapeSource(f"{engine.base_url}/metrics")),
                slo,
            )
            source.close()
    finally:
        engine.stop()


# --- 1. percentiles -----------------------------------------------------------------------------


@pytest.mark.parametrize("p", [50, 95])
def test_prometheus_ttft_percentiles_bracket_the_client_ones(
    shared: Engine, measured: Measurement, p: float
) -> None:
    frame, client = measured.frame, ttfts(measured.results)
    buckets = prometheus_buckets(shared, TTFT, frame)
    assert buckets == frame.engine_buckets(TTFT)  # Prometheus stored what the engine counted
    assert buckets[-1][1] == len(client) == MEASURED.num_requests

    estimate = histogram_quantile(p, buckets)
    lower, upper = rank_bucket(buckets, p)
    exact = percentile(client, p)
    print(f"TTFT p{p}: client {exact:.4f}s, Prometheus {estimate:.4f}s in ({lower}, {upper}]")
    assert lower < estimate <= upper
    # Every client TTFT is at least its server TTFT, so the client's order statistic is at
    # least the server's, which lies in the bucket; the overhead may lift it past the bound.
    assert lower < exact <= upper + CLIENT_OVERHEAD_S

    # The same at every bound, request by request: no request is faster at the client.
    for bound, count in buckets:
        assert (
            count_at_most(client, bound)
            <= count
            <= count_at_most(client, bound + CLIENT_OVERHEAD_S)
        ), bound

    # The PromQL the operator sends (a rate over a window) lands in the same bucket.
    promql = shared.source.query_value(
        metrics.latency_quantile("ttft", p, frame.window, TINY), at=frame.ended
    )
    assert promql is not None
    assert lower < promql <= upper


def test_client_ttft_exceeds_the_servers_by_the_client_overhead(
    shared: Engine, measured: Measurement
) -> None:
    frame, client = measured.frame, ttfts(measured.results)
    server_mean = prometheus_delta(shared, f"{TTFT}_sum", frame) / prometheus_delta(
        shared, f"{TTFT}_count", frame
    )
    offset = mean(client) - server_mean
    print(f"TTFT mean: client {mean(client):.4f}s, server {server_mean:.4f}s, offset {offset:.4f}s")
    assert 0 <= offset <= CLIENT_OVERHEAD_S


@pytest.mark.parametrize("p", [50, 95])
def test_prometheus_tpot_percentiles_bracket_the_client_ones(
    shared: Engine, measured: Measurement, p: float
) -> None:
    frame, client = measured.frame, tpots(measured.results)
    buckets = prometheus_buckets(shared, TPOT, frame)
    assert buckets == frame.engine_buckets(TPOT)
    assert buckets[-1][1] == len(client) == MEASURED.num_requests

    estimate = histogram_quantile(p, buckets)
    lower, upper = rank_bucket(buckets, p)
    exact = percentile(client, p)
    print(f"TPOT p{p}: client {exact:.5f}s, Prometheus {estimate:.5f}s in ({lower}, {upper}]")
    assert lower < estimate <= upper
    assert lower - TPOT_SLACK_S < exact <= upper + TPOT_SLACK_S

    server_mean = prometheus_delta(shared, f"{TPOT}_sum", frame) / prometheus_delta(
        shared, f"{TPOT}_count", frame
    )
    assert mean(client) == pytest.approx(server_mean, abs=TPOT_SLACK_S)

    promql = shared.source.query_value(
        metrics.latency_quantile("tpot", p, frame.window, TINY), at=frame.ended
    )
    assert promql is not None
    assert lower < promql <= upper


# --- 3. the workload fingerprint ----------------------------------------------------------------


def test_workload_fingerprint_recovers_the_generated_lengths_and_rate(
    measured: Measurement,
) -> None:
    planned = plan_requests(MEASURED)
    results, frame, fingerprint = measured.results, measured.frame, measured.fingerprint
    prompts = [plan.prompt_tokens for plan in planned]
    assert [r.prompt_tokens for r in results] == prompts  # the engine saw what was planned
    assert [r.output_tokens for r in results] == [OUTPUT_TOKENS] * len(results)

    print(f"fingerprint over {frame.window}: {fingerprint}")
    print(
        f"generated: prompt mean {mean(prompts):.1f}; sent {len(results) / frame.window_s:.3f}/s"
        f" over the window, {summarize(results).send_rate:.3f}/s between the first and last send,"
        f" {MEASURED.rate}/s planned"
    )
    assert fingerprint.prompt_mean == pytest.approx(mean(prompts), rel=0.03)
    assert fingerprint.output_mean == pytest.approx(OUTPUT_TOKENS, rel=1e-9)

    prompt_bounds = [b for b, _ in frame.after.histogram_buckets(PROMPT_TOKENS, model_name=SERVED)]
    output_bounds = [
        b for b, _ in frame.after.histogram_buckets(OUTPUT_TOKENS_HIST, model_name=SERVED)
    ]
    for p, estimate in fingerprint.prompt_quantiles.items():
        generated = percentile(prompts, p)
        lower, upper = bucket_of(generated, prompt_bounds)
        print(f"prompt p{p:g}: generated {generated:g}, Prometheus {estimate}")
        assert estimate is not None
        assert lower < estimate <= upper, p
    for p, estimate in fingerprint.output_quantiles.items():
        lower, upper = bucket_of(OUTPUT_TOKENS, output_bounds)
        assert estimate is not None
        assert lower < estimate <= upper, p

    # Every request was sent inside the window, and the engine was idle at both its ends.
    sent_rate = len(results) / frame.window_s
    assert fingerprint.arrival_rate == pytest.approx(sent_rate, rel=0.15)


# --- 4. counters and gauges against the engine's own /metrics ---------------------------------


def test_generation_throughput_is_the_engine_counter_delta(
    shared: Engine, measured: Measurement
) -> None:
    frame, name = measured.frame, "vllm:generation_tokens_total"
    engine_delta = frame.engine_delta(name)
    assert engine_delta == sum(r.output_tokens for r in measured.results)
    assert prometheus_delta(shared, name, frame) == engine_delta

    # rate() extrapolates from the first and last samples to the window's edges, each at
    # most 1.1 scrape intervals away, so its increase is the delta scaled up by at most that.
    rate = shared.source.query_value(
        metrics.generation_token_throughput(frame.window, TINY), at=frame.ended
    )
    assert rate is not None
    window = frame.window_s
    print(f"generated tokens: engine {engine_delta:g}, rate x window {rate * window:.1f}")
    assert engine_delta <= rate * window <= engine_delta * window / (window - 2.2)


def test_kv_cache_usage_is_what_the_engine_reported_at_each_scrape(shared: Engine) -> None:
    """Prometheus' samples of the gauge, each compared with the engine's own /metrics read
    around the sample's timestamp, while two long requests decode (the gauge then moves at
    each 128-token block, every half second or so)."""
    pages: list[tuple[float, float, str]] = []  # (fetch began, fetch ended, text)
    done = threading.Event()

    def poll() -> None:
        # Parsing an exposition takes ~0.5 s of Python under load: fetch now, parse later.
        while not done.is_set():
            began = time.time()
            with urllib.request.urlopen(shared.scrape.url, timeout=10) as response:  # noqa: S310
                text = response.read().decode()
            pages.append((began, time.time(), text))
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        frame = framed(shared, lambda: send(shared, KV_HOLDERS))
    finally:
        done.set()
        poller.join()
    readings = [
        (began, ended, Exposition.parse(text).value(KV_USAGE, model_name=SERVED))
        for began, ended, text in pages
    ]

    query = f"{KV_USAGE}{TINY}[{frame.window}]"
    series = shared.prometheus.api("query", query=query, time=repr(frame.ended))["result"]
    assert len(series) == 1
    compared = []
    for stamp, text in series[0]["values"]:
        # The engine's value at a scrape is known when the reading that ended before the
        # scrape began and the one that began after it had surely ended agree.
        before = [r for r in readings if r[1] <= stamp]
        after = [r for r in readings if r[0] >= stamp + SCRAPE_TAKES_S]
        if before and after and before[-1][2] == after[0][2]:
            compared.append((float(text), before[-1][2]))
    held = [engine for _, engine in compared if engine]
    print(f"KV usage: {len(compared)} of {len(series[0]['values'])} scrapes compared: {held}")
    assert [prom for prom, _ in compared] == [engine for _, engine in compared]
    assert len(held) >= 3  # scrapes while the requests held blocks

    # Idle again: the operator's query shows the engine's current value.
    assert shared.source.query_value(metrics.kv_cache_usage(TINY)) == shared.scrape.value(
        KV_USAGE, model_name=SERVED
    )


# --- 2. SLO-centred buckets ---------------------------------------------------------------------


@dataclass(frozen=True)
class SloRun:
    results: list[RequestResult]
    frame: Frame
    windowed: list[Bucket]  # PrometheusSource.histogram_buckets over the run's window


@pytest.fixture(scope="module")
def slo_run(slo_engine: SloEngine) -> SloRun:
    engine = slo_engine.engine
    send(engine, WARMUP)
    results: list[RequestResult] = []
    frame = framed(engine, lambda: results.extend(send(engine, SLO_RUN)))
    # increase() over a window ending "now": read while the window is the run.
    windowed = engine.source.histogram_buckets(TTFT, TINY, window=frame.window)
    return SloRun(results, frame, windowed)


def test_custom_buckets_at_the_slo_agree_with_the_client(
    slo_engine: SloEngine, slo_run: SloRun
) -> None:
    engine, slo = slo_engine.engine, slo_engine.slo
    assert slo.ttft is not None
    threshold = slo.ttft.max_seconds
    results, frame = slo_run.results, slo_run.frame
    client = ttfts(results)
    buckets = prometheus_buckets(engine, TTFT, frame)
    assert buckets == frame.engine_buckets(TTFT)
    at_threshold = dict(buckets).get(threshold)
    assert at_threshold is not None, f"{threshold} is not a bound of {[b for b, _ in buckets]}"

    total = buckets[-1][1]
    client_count = count_at_most(client, threshold)
    print(
        f"TTFT <= {threshold}s: Prometheus {at_threshold:g}/{total:g}, "
        f"client {client_count}/{len(client)} (client p95 {percentile(client, 95):.4f}s)"
    )
    assert total == len(client) == SLO_RUN.num_requests
    # The error model, measured in this run: the client's mean overhead on a TTFT is the
    # difference of the client's and the engine's sums over the same requests. No request is
    # faster at the client; the overhead can carry the requests just under the bound at the
    # engine past it at the client, those within OVERHEAD_SPREAD x that mean of the bound.
    overhead = (sum(client) - frame.engine_delta(f"{TTFT}_sum")) / len(client)
    reach = max(OVERHEAD_SPREAD * overhead, MIN_OVERHEAD_S)
    print(f"client TTFT overhead: mean {overhead * 1000:.2f} ms, tolerance {reach * 1000:.1f} ms")
    assert 0 <= overhead <= CLIENT_OVERHEAD_S
    assert client_count <= at_threshold <= count_at_most(client, threshold + reach)

    verdict = judge_histogram(buckets, slo.ttft.percentile, threshold)
    from_samples = evaluate_samples(slo, {"ttft": client})
    print(f"verdicts: Prometheus {verdict.reason}; client {from_samples.describe()}")
    assert verdict.resolvable
    assert verdict.met is not None
    if verdict.met != from_samples.met:
        # The one disagreement the overhead allows: the request that decides p95 was under
        # the threshold at the server and over it at the client, by no more than the overhead.
        deciding = sorted(client)[math.ceil(slo.ttft.percentile / 100 * len(client)) - 1]
        assert from_samples.met is False
        assert threshold < deciding <= threshold + CLIENT_OVERHEAD_S

    # The source's increase() buckets scale every count by about the same extrapolation
    # factor, so the fraction at the threshold survives it.
    windowed = dict(slo_run.windowed)
    fraction = windowed[threshold] / windowed[math.inf]
    print(f"fraction at the threshold from increase(): {fraction:.4f}")
    assert fraction == pytest.approx(at_threshold / total, abs=0.03)


def test_preemptions_in_prometheus_are_the_engines(slo_engine: SloEngine, slo_run: SloRun) -> None:
    engine, name = slo_engine.engine, "vllm:num_preemptions_total"
    print(f"preemptions during the SLO run: {slo_run.frame.engine_delta(name):g}")
    results: list[RequestResult] = []
    frame = framed(engine, lambda: results.extend(send(engine, BURST)))
    # Preempted requests are recomputed, not failed.
    assert [r.output_tokens for r in results] == [BURST.output_tokens] * BURST.num_requests

    engine_delta = frame.engine_delta(name)
    from_prometheus = prometheus_delta(engine, name, frame)
    increase = engine.source.query_value(
        metrics.preemption_increase(frame.window, TINY), at=frame.ended
    )
    print(f"preemptions: engine {engine_delta:g}, Prometheus {from_prometheus:g}, {increase=}")
    assert engine_delta > 0
    assert from_prometheus == engine_delta
    window = frame.window_s
    assert increase is not None
    assert engine_delta <= increase <= engine_delta * window / (window - 2.2)

    peak = engine.source.query_value(metrics.kv_cache_usage_max(frame.window, TINY), at=frame.ended)
    print(f"KV usage peak during the burst: {peak}")
    assert engine.source.query_value(metrics.kv_cache_usage(TINY)) == engine.scrape.value(
        KV_USAGE, model_name=SERVED
    )
