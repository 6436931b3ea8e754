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
request, the SSE write and its own event loop. So each client TTFT is its server TTFT plus an
overhead o_i >= 0: a few milliseconds on average, but on two cores shared with the engine a
request's overhead can reach hundreds (CI saw two of 101 requests over 100 ms).

The error model is therefore measured in each run, not assumed: the sum of the overheads is
the client's TTFT sum minus the engine's, both exact over the framed requests. Since every
o_i >= 0, at most sum / r requests can have an overhead above r (Markov's inequality, here a
certainty, not a probability), whatever the overheads' distribution; `Error.explains` checks
the server's bucket counts against the client's values with that at every bound and for a
range of r. TPOT takes the overheads on the first and on the last token (the latter from the
end-to-end sums) spread over `OUTPUT_TOKENS - 1` tokens, in either direction.
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

from slotune.engine.vllm import custom_histogram_buckets
from slotune.local.process import LocalEngine, LocalRuntime, cpu_dtype
from slotune.measure.loadgen import RequestResult, Workload, plan_requests, run_workload, summarize
from slotune.metrics import (
    Exposition,
    PrometheusSource,
    ScrapeSource,
    WorkloadFingerprint,
    model_selector,
)
from slotune.models import EngineArgs, SloSpec, SloTarget
from slotune.runtime import EngineConfig
from slotune.slo.histogram import evaluate_samples, histogram_quantile, judge_histogram
from slotune.stats import mean, percentile
from support import promql as queries
from support.engine import TINY_MODEL
from support.prometheus import PrometheusServer, prometheus_binary

pytestmark = pytest.mark.engine

SERVED = "tiny"
TINY = model_selector(model_name=SERVED)
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

KV_BYTES_PER_TOKEN = 4 * 2 * 4 * 32 * (2 if cpu_dtype() == "bfloat16" else 4)
"""4 layers x K,V x 4 heads x 32 dims, at the model's dtype on this CPU (`cpu_dtype`)."""
SMALL_KV_BYTES = 48 * 128 * KV_BYTES_PER_TOKEN
"""48 blocks of 128 tokens: room for six full-length requests, so a Poisson run rarely
preempts and the burst must."""

REACHES_S = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""The distances from a bucket bound at which `Error.explains` counts the requests that the
error could have carried across it."""

KV_HOLDERS = Workload(num_requests=10, seed=3, concurrency=2, prompt_tokens=600, output_tokens=1000)
"""Two at a time, in step, about 5 s each: KV blocks held for about 25 s. A scrape can be
compared only if no request finished between the readings around it: long requests finish
rarely (24 requests of 400 tokens left 2 of 24 scrapes comparable beside a busy loop)."""

START_TIMEOUT = 300.0

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
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


@dataclass(frozen=True)
class Error:
    """How a run's client values differ from the server's for the same requests: client_i =
    server_i + e_i, with sum |e_i| <= `total_s`, and e_i >= 0 when `one_sided`."""

    total_s: float
    one_sided: bool

    def explains(self, buckets: Sequence[Bucket], client: Sequence[float]) -> None:
        """Asserts that the server's cumulative bucket counts can come from the client's values
        under this error. At a bound b, the requests counted at or under b by one side and
        above b + r (or b - r) by the other each have |e_i| > r: at most total_s / r of them."""
        for bound, count in buckets:
            if math.isinf(bound):
                continue
            if self.one_sided:  # no request is faster at the client
                assert count_at_most(client, bound) <= count, bound
            for reach in REACHES_S:
                most = self.total_s / reach
                carried_up = count - count_at_most(client, bound + reach)
                assert carried_up <= most, (bound, reach, carried_up, most)
                if not self.one_sided:
                    carried_down = count_at_most(client, bound - reach) - count
                    assert carried_down <= most, (bound, reach, carried_down, most)


def ttft_excess(results: Sequence[RequestResult], frame: Frame) -> float:
    """The client's TTFT sum minus the engine's, over the frame's requests."""
    return sum(ttfts(results)) - frame.engine_delta(f"{TTFT}_sum")


def ttft_error(results: Sequence[RequestResult], frame: Frame) -> Error:
    """The TTFT overheads, of which `ttft_excess` is the sum."""
    total = ttft_excess(results, frame)
    print(f"client TTFT overhead: mean {total / len(results) * 1000:.2f} ms")
    assert total >= 0
    return Error(total, one_sided=True)


def tpot_error(results: Sequence[RequestResult], frame: Frame) -> Error:
    """A client TPOT is its server TPOT plus (overhead on the last token - overhead on the
    first) / (tokens - 1). Both overheads are >= 0 and at most what the client's end-to-end
    time and TTFT exceed the server's by, so the sum of |e_i| is at most the two excesses'
    sums over OUTPUT_TOKENS - 1."""
    first = ttft_excess(results, frame)
    last = sum(r.e2e for r in results) - frame.engine_delta(f"{E2E}_sum")
    print(f"client excess: TTFT {first:.4f}s, end to end {last:.4f}s in all")
    assert first >= 0
    assert last >= 0
    return Error((first + last) / (OUTPUT_TOKENS - 1), one_sided=False)


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
    # least the server's, which lies in the bucket; the overhead may lift it past the bound,
    # by as much as the measured overheads allow at every bound.
    assert lower < exact
    ttft_error(measured.results, frame).explains(buckets, client)

    # The PromQL the operator sends (a rate over a window) lands in the same bucket.
    promql = shared.source.query_value(
        queries.latency_quantile("ttft", p, frame.window, TINY), at=frame.ended
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
    # The offset is the run's mean overhead: 4-8 ms on an idle two-core machine, 29 ms on a
    # busy CI machine, over 100 ms with a busy loop beside the tests. No fixed bound holds
    # for it; what must hold is its sign.
    print(f"TTFT mean: client {mean(client):.4f}s, server {server_mean:.4f}s, offset {offset:.4f}s")
    assert offset >= 0


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
    error = tpot_error(measured.results, frame)
    error.explains(buckets, client)

    server_mean = prometheus_delta(shared, f"{TPOT}_sum", frame) / prometheus_delta(
        shared, f"{TPOT}_count", frame
    )
    assert mean(client) == pytest.approx(server_mean, abs=error.total_s / len(client))

    promql = shared.source.query_value(
        queries.latency_quantile("tpot", p, frame.window, TINY), at=frame.ended
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
        queries.generation_token_throughput(frame.window, TINY), at=frame.ended
    )
    assert rate is not None
    window = frame.window_s
    print(f"generated tokens: engine {engine_delta:g}, rate x window {rate * window:.1f}")
    assert engine_delta <= rate * window <= engine_delta * window / (window - 2.2)


@dataclass(frozen=True)
class Reading:
    """The engine's own /metrics, fetched between two wall-clock moments."""

    began: float
    ended: float
    exposition: Exposition

    @property
    def kv_usage(self) -> float | None:
        return self.exposition.value(KV_USAGE, model_name=SERVED)

    def bounds_until(self, later: Reading) -> tuple[float, float] | None:
        """Bounds on the KV-cache gauge between this reading and `later`, when no request
        finished or was preempted in between: KV blocks are freed only then, so the gauge
        could only rise, from this reading's value to `later`'s."""
        frees = ("vllm:request_success_total", "vllm:num_preemptions_total")
        if any(
            self.exposition.value(name, model_name=SERVED)
            != later.exposition.value(name, model_name=SERVED)
            for name in frees
        ):
            return None
        low, high = self.kv_usage, later.kv_usage
        assert low is not None
        assert high is not None
        assert low <= high, f"the KV-cache gauge fell from {low} to {high} with nothing freed"
        return low, high


KV_ROUNDS = 6
"""Rounds of KV_HOLDERS, at most, until enough scrapes could be compared while blocks were
held: on a loaded machine the engine's /metrics took up to 3.4 s to answer, and a round
compared none (make test under a one-core hog, 2026-12-04); run alone under that hog, the
fourth round was the first to compare enough."""


def test_kv_cache_usage_is_what_the_engine_reported_at_each_scrape(shared: Engine) -> None:
    """Prometheus' samples of the gauge, each compared with the engine's own /metrics read
    around the sample's timestamp, while two long requests decode (the gauge then moves at
    each 128-token block, every half second or so). A round that compares fewer than three
    scrapes while blocks are held is followed by another, up to KV_ROUNDS; every scrape that
    can be compared must agree, in every round."""
    held: list[float] = []
    for _ in range(KV_ROUNDS):
        held += _kv_round(shared)
        if len(held) >= 3:
            break
    assert len(held) >= 3  # scrapes while the requests held blocks

    # Idle again: the operator's query shows the engine's current value.
    assert shared.source.query_value(queries.kv_cache_usage(TINY)) == shared.scrape.value(
        KV_USAGE, model_name=SERVED
    )


def _kv_round(shared: Engine) -> list[float]:
    """One round of KV_HOLDERS: every scrape that can be compared is checked; returns the
    values of those taken while blocks were held."""
    pages: list[tuple[float, float, str]] = []  # (fetch began, fetch ended, text)
    done = threading.Event()
    failures: list[Exception] = []

    def poll() -> None:
        # Parsing an exposition takes ~0.5 s of Python under load: fetch now, parse later.
        try:
            while not done.is_set():
                began = time.time()
                with urllib.request.urlopen(shared.scrape.url, timeout=30) as response:  # noqa: S310
                    text = response.read().decode()
                pages.append((began, time.time(), text))
                time.sleep(0.05)
        except Exception as error:  # noqa: BLE001 - the test fails with it, below
            failures.append(error)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        frame = framed(shared, lambda: send(shared, KV_HOLDERS))
    finally:
        done.set()
        poller.join()
    assert not failures, failures
    readings = [Reading(began, ended, Exposition.parse(text)) for began, ended, text in pages]

    query = f"{KV_USAGE}{TINY}[{frame.window}]"
    series = shared.prometheus.api("query", query=query, time=repr(frame.ended))["result"]
    assert len(series) == 1
    # How long each of those scrapes took, by its timestamp: the engine answered Prometheus
    # somewhere between the timestamp (when the scrape began) and that much later.
    instance = series[0]["metric"]["instance"]
    durations = shared.prometheus.api(
        "query",
        query=f'scrape_duration_seconds{{instance="{instance}"}}[{frame.window}]',
        time=repr(frame.ended),
    )["result"]
    took = {stamp: float(text) for stamp, text in durations[0]["values"]}
    compared: list[tuple[float, float, float]] = []  # (engine before, Prometheus, engine after)
    for stamp, text in series[0]["values"]:
        # The engine's value at a scrape lies between those of the reading that ended last
        # before the scrape began and the one that began first after it had ended, when the
        # gauge could only rise in between (`Reading.bounds_until`); when both agree, it is
        # known exactly.
        before = [r for r in readings if r.ended <= stamp]
        after = [r for r in readings if r.began >= stamp + took[stamp]]
        if before and after and (bounds := before[-1].bounds_until(after[0])):
            compared.append((bounds[0], float(text), bounds[1]))
    exact = [prom for low, prom, high in compared if low == high]
    held = [prom for low, prom, high in compared if low > 0]
    print(
        f"KV usage: {len(compared)} of {len(series[0]['values'])} scrapes compared, {len(exact)}"
        f" exactly; while blocks were held: {held}"
    )
    print(f"scrape durations: max {max(took.values()) * 1000:.0f} ms")
    for low, prom, high in compared:
        assert low <= prom <= high, (low, prom, high)
    return held


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
    # The error model, measured in this run (see the module's docstring): no request is
    # faster at the client; the overheads can carry requests just under a bound at the engine
    # past it at the client, as many as their measured sum allows.
    ttft_error(results, frame).explains(buckets, client)

    verdict = judge_histogram(buckets, slo.ttft.percentile, threshold)
    from_samples = evaluate_samples(slo, {"ttft": client})
    print(f"verdicts: Prometheus {verdict.reason}; client {from_samples.describe()}")
    assert verdict.resolvable
    assert verdict.met is not None
    if verdict.met != from_samples.met:
        # The one disagreement the overhead allows: requests under the threshold at the
        # server were carried over it at the client (how far, `explains` checked above).
        assert from_samples.met is False
        assert at_threshold > client_count

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
        queries.preemption_increase(frame.window, TINY), at=frame.ended
    )
    print(f"preemptions: engine {engine_delta:g}, Prometheus {from_prometheus:g}, {increase=}")
    assert engine_delta > 0
    assert from_prometheus == engine_delta
    window = frame.window_s
    assert increase is not None
    assert engine_delta <= increase <= engine_delta * window / (window - 2.2)

    peak = engine.source.query_value(queries.kv_cache_usage_max(frame.window, TINY), at=frame.ended)
    print(f"KV usage peak during the burst: {peak}")
    assert engine.source.query_value(queries.kv_cache_usage(TINY)) == engine.scrape.value(
        KV_USAGE, model_name=SERVED
    )
