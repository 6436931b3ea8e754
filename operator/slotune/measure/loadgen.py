"""The load generator: replays a seeded workload against an OpenAI-compatible `/v1/completions`
endpoint with streaming, and measures what a user of the engine sees (TTFT, ITL, TPOT, e2e).

The tuner judges a vLLM configuration by these numbers, so the generator must be reproducible
(one seed fixes prompts, lengths and arrival times), open-loop when asked (a slow response
never delays later sends, or the load would ease off exactly when the engine struggles), and
honest about itself: every request records how late the generator sent it (scheduling lag), so
a run can say whether it measured the engine or its own backlog.

The shape is a pure core between thin shells: `plan_requests`/`arrival_times` decide everything
from the `Workload`, `summarize` reduces plain results, and only `run_workload` does I/O.

Metric definitions follow `vllm bench serve`: TTFT is the time to the first chunk carrying a
token; ITL is the gap between consecutive token-carrying chunks, recorded once per chunk even
when a chunk carries several tokens (so ITL describes what a streaming client observes, while
TPOT spreads the decode time over every token); TPOT = (e2e - ttft) / (output_tokens - 1), and 0
for a single output token; goodput counts requests that meet every given SLO.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict

from slotune.engine import ENGINES
from slotune.slo import attainment
from slotune.stats import mean, percentile

Clock = Callable[[], float]

SLO_METRICS = tuple(attainment.SLO_METRICS)
"""Metrics a goodput SLO may name (the SLO-metric registry's); values are seconds (`vllm bench
serve --goodput` takes ms)."""

COMPLETIONS_PATH = "/v1/completions"
MIN_TOKEN_ID = 10
"""Random prompt ids start here, clear of the special tokens most vocabularies put first."""
_SALT = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""What slotune sends as a `cache_salt`: vLLM takes at most 128 characters, without '@', '/',
backslash or NUL."""

_WORD_LIST = (
    "the of and to in is was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she "
    "which do their time if will way about many then them write would like so these her long "
    "make thing see him two has look more day could go come did number sound no most people my "
    "over know water than call first who may down side been now find any new work part take get "
    "place made live where after back little only round man year came show every good me give "
    "our under name very through just form sentence great think say help low line differ turn"
)
_WORDS = _WORD_LIST.split()
"""Common English words, about one token each in most tokenizers, for `--text-prompts`."""

_READ_BUFFER_BYTES = 4 * 1024 * 1024
"""vLLM's first chunk can carry every prompt token id; aiohttp's 64 KiB default would fail a
long prompt with "Chunk too big"."""


@dataclass(frozen=True)
class Workload:
    """What to send and how. Exactly one of `rate` (open loop, Poisson arrivals in requests/s;
    `math.inf` sends everything at once) and `concurrency` (closed loop) is set.

    `num_requests` counts measured requests; `warmup_requests` more are sent first, with the
    same load shape, awaited, and left out of the results. Lengths are drawn uniformly from
    mean * [1 - spread, 1 + spread], as `vllm bench serve --random-range-ratio` does. The first
    `shared_prefix_ratio * prompt_len` tokens of every prompt (warm-ups included) come from one
    shared sequence, so prefix caching has something to hit.

    `cache_salt`, where set, goes with every request (vLLM's `cache_salt`): the engine mixes it
    into the hash of each prompt's first KV block, so these requests share cached blocks with
    each other and with nothing sent under another salt. Probes of one engine start send the
    same prompts at different rates, and a salt per probe keeps each from hitting what the
    last one left, without the engine's cache-reset endpoint (which needs vLLM's dev mode)."""

    num_requests: int = 100
    seed: int = 0
    rate: float | None = None
    concurrency: int | None = None
    prompt_tokens: int = 256
    prompt_spread: float = 0.0
    output_tokens: int = 64
    output_spread: float = 0.0
    shared_prefix_ratio: float = 0.0
    warmup_requests: int = 0
    vocab_size: int = 32000
    timeout_s: float = 300.0
    text_prompts: bool = False
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if (self.rate is None) == (self.concurrency is None):
            problems.append("set exactly one of rate and concurrency")
        if self.rate is not None and not self.rate > 0:
            problems.append(f"rate must be > 0, got {self.rate}")
        if self.concurrency is not None and self.concurrency < 1:
            problems.append(f"concurrency must be >= 1, got {self.concurrency}")
        if self.num_requests < 1:
            problems.append(f"num_requests must be >= 1, got {self.num_requests}")
        if self.warmup_requests < 0:
            problems.append(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            problems.append("prompt_tokens and output_tokens must be >= 1")
        for name in ("prompt_spread", "output_spread"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"{name} must be within [0, 1), got {getattr(self, name)}")
        if not 0 <= self.shared_prefix_ratio <= 1:
            problems.append(
                f"shared_prefix_ratio must be within [0, 1], got {self.shared_prefix_ratio}"
            )
        if self.vocab_size <= MIN_TOKEN_ID:
            problems.append(f"vocab_size must be > {MIN_TOKEN_ID}, got {self.vocab_size}")
        if not self.timeout_s > 0:
            problems.append(f"timeout_s must be > 0, got {self.timeout_s}")
        problems += _salt_problems(self.cache_salt)
        if problems:
            raise ValueError("; ".join(problems))


def _salt_problems(salt: str | None) -> list[str]:
    if salt is None or _SALT.fullmatch(salt):
        return []
    return [f"cache_salt must be 1-128 of [A-Za-z0-9._-], got {salt!r}"]


@dataclass(frozen=True)
class PlannedRequest:
    """One request decided in advance: the prompt (token ids, or text) and its lengths."""

    index: int
    prompt: list[int] | str
    prompt_tokens: int
    output_tokens: int
    cache_salt: str | None = None


@dataclass(frozen=True)
class RequestResult:
    """What one request did. Times are seconds; `sent_at` and `scheduled_at` are relative to
    the start of the measured run (monotonic clock). `scheduling_lag` = sent_at - scheduled_at:
    how late the generator itself was. `ttft` is None when no token arrived; `error` is None
    for a request that completed."""

    index: int
    scheduled_at: float
    sent_at: float
    e2e: float
    ttft: float | None
    itls: list[float]
    prompt_tokens: int
    output_tokens: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def scheduling_lag(self) -> float:
        return self.sent_at - self.scheduled_at

    @property
    def tpot(self) -> float | None:
        if self.ttft is None:
            return None
        if self.output_tokens <= 1:
            return 0.0
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def max_itl(self) -> float:
        return max(self.itls, default=0.0)

    def to_dict(self) -> dict[str, Any]:
        """The recorded fields plus the derived tpot and scheduling_lag."""
        return asdict(self) | {"tpot": self.tpot, "scheduling_lag": self.scheduling_lag}


# --- the pure core: plan ---------------------------------------------------------------------


def _rng(seed: int, stream: str) -> random.Random:
    """One independent stream per aspect, so changing prompt lengths keeps the arrival times."""
    return random.Random(f"{seed}:{stream}")  # noqa: S311 - reproducible load, not secrets


def sample_length(rng: random.Random, mean_tokens: int, spread: float) -> int:
    low = max(1, int(mean_tokens * (1 - spread)))
    high = max(low, int(mean_tokens * (1 + spread)))
    return rng.randint(low, high)


def arrival_times(workload: Workload, count: int | None = None) -> list[float]:
    """Scheduled send times (s from the start) of an open-loop run: the first at 0, then
    exponential gaps with mean 1/rate, from the seed alone."""
    if workload.rate is None:
        raise ValueError("arrival times need an open-loop workload (rate)")
    count = workload.num_requests if count is None else count
    rng = _rng(workload.seed, "arrivals")
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        if not math.isinf(workload.rate):
            now += rng.expovariate(workload.rate)
    return times


def plan_requests(workload: Workload) -> list[PlannedRequest]:
    """Warm-up requests first, then the measured ones, all from the seed."""
    total = workload.warmup_requests + workload.num_requests
    lengths = _rng(workload.seed, "lengths")
    sizes = [
        (
            sample_length(lengths, workload.prompt_tokens, workload.prompt_spread),
            sample_length(lengths, workload.output_tokens, workload.output_spread),
        )
        for _ in range(total)
    ]
    tokens = _rng(workload.seed, "tokens")
    longest = max(prompt for prompt, _ in sizes)
    shared = _random_tokens(tokens, workload, int(workload.shared_prefix_ratio * longest))
    plans = []
    for index, (prompt_len, output_len) in enumerate(sizes):
        prefix_len = int(workload.shared_prefix_ratio * prompt_len)
        ids = shared[:prefix_len] + _random_tokens(tokens, workload, prompt_len - prefix_len)
        prompt: list[int] | str = ids
        if workload.text_prompts:
            prompt = " ".join(_WORDS[i % len(_WORDS)] for i in ids)
        plans.append(PlannedRequest(index, prompt, prompt_len, output_len, workload.cache_salt))
    return plans


def _random_tokens(rng: random.Random, workload: Workload, count: int) -> list[int]:
    return [rng.randrange(MIN_TOKEN_ID, workload.vocab_size) for _ in range(count)]


def request_body(model: str, plan: PlannedRequest) -> dict[str, Any]:
    salt = {} if plan.cache_salt is None else {"cache_salt": plan.cache_salt}
    return {
        **salt,
        "model": model,
        "prompt": plan.prompt,
        "max_tokens": plan.output_tokens,
        "min_tokens": plan.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }


def api_key() -> str | None:
    """The engine's API key, where this process has it: an engine started with one (from the
    LLMDeployment's Secret, in the engine's variable) wants it on /v1, and a trial's load Job
    has the same variable from the same Secret."""
    return next(
        (os.environ[e.api_key_env] for e in ENGINES.values() if e.api_key_env in os.environ), None
    )


def completions_url(url: str) -> str:
    """A server's base URL, or the full completions URL, as the completions URL."""
    url = url.rstrip("/")
    return url if url.endswith(COMPLETIONS_PATH) else url + COMPLETIONS_PATH


# --- the pure core: summarize ----------------------------------------------------------------


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class MetricStats(BaseModel):
    """Seconds. None where there were no samples."""

    model_config = ConfigDict(frozen=True)

    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> MetricStats:
        return cls(
            mean=_finite(mean(values)),
            **{f"p{p}": _finite(percentile(values, p)) for p in (50, 90, 95, 99)},
        )


class LagStats(BaseModel):
    """The generator's own lateness (s): actual minus scheduled send time."""

    model_config = ConfigDict(frozen=True)

    p50: float | None
    p99: float | None
    max: float | None


class Summary(BaseModel):
    """A run reduced to what the tuner and a person read. Throughputs are per second of
    `duration_s`, from the scheduled start to the last response; token counts are of completed
    requests. `goodput` is None without SLOs."""

    model_config = ConfigDict(frozen=True)

    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    input_throughput: float
    output_throughput: float
    send_rate: float | None
    ttft: MetricStats
    tpot: MetricStats
    itl: MetricStats
    e2e: MetricStats
    scheduling_lag: LagStats
    slo: dict[str, float]
    good_requests: int | None
    goodput: float | None
    errors: dict[str, int]
    requests: list[dict[str, Any]] | None = None

    def to_json(self, *, samples: bool = True) -> str:
        return self.model_dump_json(indent=2, exclude=None if samples else {"requests"})


def meets_slo(result: RequestResult, slo: Mapping[str, float]) -> bool:
    """True when a completed request meets every threshold: each of its samples of each metric
    is within the bound, the samples being the attainment rule's own (`attainment.per_request`:
    one per request for TTFT, TPOT and e2e, every gap for ITL). A metric of which the request
    has no sample (TPOT of a one-token answer) does not count against it, as in the attainment."""
    if not result.ok:
        return False
    for name, limit in slo.items():
        ((good, total),) = attainment.per_request(name, [result], limit)
        if good < total:
            return False
    return True


def check_slo(slo: Mapping[str, float]) -> None:
    unknown = sorted(set(slo) - set(SLO_METRICS))
    if unknown:
        raise ValueError(f"unknown SLO metric(s) {unknown}; use {', '.join(SLO_METRICS)}")


def summarize(
    results: Sequence[RequestResult],
    slo: Mapping[str, float] | None = None,
    *,
    include_requests: bool = False,
) -> Summary:
    slo = dict(slo or {})
    check_slo(slo)
    done = [r for r in results if r.ok]
    duration = max((r.sent_at + r.e2e for r in results), default=0.0)
    sends = sorted(r.sent_at for r in results)
    send_span = sends[-1] - sends[0] if sends else 0.0
    lags = [r.scheduling_lag for r in results]
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    good = sum(meets_slo(r, slo) for r in done) if slo else None

    def per_second(amount: float) -> float:
        return amount / duration if duration > 0 else 0.0

    return Summary(
        completed=len(done),
        failed=len(results) - len(done),
        duration_s=duration,
        request_throughput=per_second(len(done)),
        input_throughput=per_second(sum(r.prompt_tokens for r in done)),
        output_throughput=per_second(sum(r.output_tokens for r in done)),
        send_rate=(len(sends) - 1) / send_span if send_span > 0 else None,
        ttft=MetricStats.of([r.ttft for r in done if r.ttft is not None]),
        tpot=MetricStats.of([r.tpot for r in done if r.tpot is not None]),
        itl=MetricStats.of([gap for r in done for gap in r.itls]),
        e2e=MetricStats.of([r.e2e for r in done]),
        scheduling_lag=LagStats(
            p50=_finite(percentile(lags, 50)),
            p99=_finite(percentile(lags, 99)),
            max=max(lags, default=None),
        ),
        slo=slo,
        good_requests=good,
        goodput=None if good is None else per_second(good),
        errors=errors,
        requests=[r.to_dict() for r in results] if include_requests else None,
    )


def format_summary(summary: Summary) -> str:
    """A human-readable table: counts and rates, then each latency metric in milliseconds."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.2f}"

    lines = [
        f"{'completed':<24}{summary.completed}",
        f"{'failed':<24}{summary.failed}",
        f"{'duration (s)':<24}{summary.duration_s:.2f}",
        f"{'requests/s':<24}{summary.request_throughput:.2f}",
        f"{'input tokens/s':<24}{summary.input_throughput:.1f}",
        f"{'output tokens/s':<24}{summary.output_throughput:.1f}",
    ]
    if summary.goodput is not None:
        slo = ", ".join(f"{k}<={v * 1000:g}ms" for k, v in summary.slo.items())
        lines.append(
            f"{'goodput (req/s)':<24}{summary.goodput:.2f}"
            f"  ({summary.good_requests}/{summary.completed} met {slo})"
        )
    lines += ["", f"{'ms':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p95':>10}{'p99':>10}"]
    for name in ("ttft", "tpot", "itl", "e2e"):
        stats: MetricStats = getattr(summary, name)
        cells = (stats.mean, stats.p50, stats.p90, stats.p95, stats.p99)
        lines.append(f"{name:<10}" + "".join(f"{ms(v):>10}" for v in cells))
    lag = summary.scheduling_lag
    lines += [
        "",
        f"scheduling lag (ms): p50 {ms(lag.p50)}  p99 {ms(lag.p99)}  max {ms(lag.max)}",
    ]
    lines += [f"error x{count}: {error}" for error, count in summary.errors.items()]
    return "\n".join(lines)


# --- the I/O shell ---------------------------------------------------------------------------


class StreamTally:
    """Timing and token counts of one streamed response, chunk by chunk. `sent` is on the
    sender's clock; `ttft` is None until the first token has come."""

    def __init__(self, sent: float, prompt_tokens: int) -> None:
        self.sent = sent
        self.ttft: float | None = None
        self.last = sent
        self.itls: list[float] = []
        self.counted = 0
        self.usage_tokens: int | None = None
        self.prompt_tokens = prompt_tokens

    def observe(self, chunk: Mapping[str, Any], now: float) -> None:
        tokens, carried = _chunk_tokens(chunk)
        self.counted += tokens
        if carried:
            if self.ttft is None:
                self.ttft = now - self.sent
            else:
                self.itls.append(now - self.last)
            self.last = now
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage_tokens = usage.get("completion_tokens", self.usage_tokens)
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)

    @property
    def output_tokens(self) -> int:
        """From token_ids; the final usage block only when no chunk carried token_ids."""
        return self.counted or self.usage_tokens or 0


def _chunk_tokens(chunk: Mapping[str, Any]) -> tuple[int, bool]:
    """(tokens counted from token_ids, whether the chunk carried output at all)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return 0, False
    ids = choices[0].get("token_ids")
    if isinstance(ids, list):
        return len(ids), bool(ids)
    return 0, bool(choices[0].get("text"))


async def _stream(response: aiohttp.ClientResponse, tally: StreamTally, clock: Clock) -> str | None:
    """Reads the SSE stream into `tally`; returns an error text, or None."""
    if response.status != 200:
        return f"HTTP {response.status}: {(await response.text())[:200]}"
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        now = clock()
        chunk = json.loads(data)
        if isinstance(chunk, dict):
            if "error" in chunk:
                return f"stream error: {chunk['error']}"[:300]
            tally.observe(chunk, now)
    return None


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    plan: PlannedRequest,
    *,
    clock: Clock,
    start: float,
    scheduled_at: float,
    in_flight: dict[int, StreamTally] | None = None,
) -> RequestResult:
    sent = clock()
    tally = StreamTally(sent, plan.prompt_tokens)
    if in_flight is not None:
        in_flight[plan.index] = tally
    try:
        async with session.post(url, json=request_body(model, plan)) as response:
            error = await _stream(response, tally, clock)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300] if str(exc) else type(exc).__name__
    finally:
        if in_flight is not None:
            in_flight.pop(plan.index, None)
    end = clock()
    if error is None and tally.ttft is None:
        error = "no tokens received"
    return RequestResult(
        index=plan.index,
        scheduled_at=scheduled_at,
        sent_at=sent - start,
        e2e=end - sent,
        ttft=tally.ttft,
        itls=tally.itls,
        prompt_tokens=tally.prompt_tokens,
        output_tokens=tally.output_tokens,
        error=error,
    )


Send = Callable[[PlannedRequest, float, float], Coroutine[Any, Any, RequestResult]]


async def _open_loop(
    send: Send, plans: Sequence[PlannedRequest], arrivals: Sequence[float], clock: Clock
) -> list[RequestResult]:
    """Sends on an absolute timeline: each wait is to `start + arrival`, never relative to the
    previous send, so a backlog shows up as scheduling lag instead of a lower rate. asyncio's
    epoll waits round timeouts up to whole milliseconds, so even an idle generator shows about
    0.5-1 ms of lag; that shifts arrivals, not the latencies, which start at the actual send."""
    start = clock()
    tasks: list[asyncio.Task[RequestResult]] = []
    for plan, arrival in zip(plans, arrivals, strict=True):
        delay = start + arrival - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(plan, start, arrival)))
    return list(await asyncio.gather(*tasks))


async def _closed_loop(
    send: Send, plans: Sequence[PlannedRequest], concurrency: int, clock: Clock
) -> list[RequestResult]:
    """N workers, each sending its next request when its previous one finished; a request is
    scheduled for the moment its worker became free."""
    start = clock()
    queue = iter(plans)
    results: list[RequestResult] = []

    async def worker() -> None:
        free_at = 0.0
        for plan in queue:  # one shared iterator: asyncio hands each plan to one worker
            results.append(await send(plan, start, free_at))
            free_at = clock() - start

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(plans)))))
    return sorted(results, key=lambda r: r.index)


@contextlib.asynccontextmanager
async def sender(
    url: str,
    model: str,
    *,
    timeout_s: float,
    clock: Clock,
    in_flight: dict[int, StreamTally] | None = None,
) -> AsyncIterator[Send]:
    """A session to one engine and the coroutine that sends one planned request over it.
    With `in_flight`, every request sent and not yet finished is in it by its plan's index
    (what a caller watches to judge requests before they finish)."""
    target = completions_url(url)
    connector = aiohttp.TCPConnector(limit=0)  # a pool limit would hide queueing from the lag
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    key = api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, read_bufsize=_READ_BUFFER_BYTES, headers=headers
    ) as session:

        async def send(plan: PlannedRequest, start: float, scheduled_at: float) -> RequestResult:
            return await _send(
                session,
                target,
                model,
                plan,
                clock=clock,
                start=start,
                scheduled_at=scheduled_at,
                in_flight=in_flight,
            )

        yield send


async def run_workload(
    url: str,
    model: str,
    workload: Workload,
    *,
    clock: Clock = time.perf_counter,
    plans: Sequence[PlannedRequest] | None = None,
) -> list[RequestResult]:
    """Sends the warm-up requests and awaits them, then the measured ones; returns the results
    of the measured requests only. Request failures are results with an `error`, never raised."""
    plans = plan_requests(workload) if plans is None else plans
    async with sender(url, model, timeout_s=workload.timeout_s, clock=clock) as send:

        async def phase(batch: Sequence[PlannedRequest]) -> list[RequestResult]:
            if not batch:
                return []
            if workload.concurrency is not None:
                return await _closed_loop(send, batch, workload.concurrency, clock)
            return await _open_loop(send, batch, arrival_times(workload, len(batch)), clock)

        await phase(plans[: workload.warmup_requests])
        return await phase(plans[workload.warmup_requests :])


# --- the command line ------------------------------------------------------------------------


def parse_slo(items: Iterable[str]) -> dict[str, float]:
    """`ttft=2.0` style items (seconds) as a mapping."""
    slo: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--slo takes METRIC=SECONDS, got {item!r}")
        try:
            slo[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--slo {item!r}: {value!r} is not a number of seconds") from None
    check_slo(slo)
    return slo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slotune loadgen",
        description="Replay a seeded streaming workload against /v1/completions and report "
        "TTFT, TPOT, ITL, e2e latency and goodput.",
    )
    parser.add_argument("--url", required=True, help="server base URL (e.g. http://127.0.0.1:8000)")
    parser.add_argument("--model", required=True, help="model name sent in each request")
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument(
        "--rate", type=float, help="open loop: Poisson arrivals, requests/s ('inf': all at once)"
    )
    shape.add_argument("--concurrency", type=int, help="closed loop: requests in flight")
    parser.add_argument("--num-requests", type=int, default=100, help="measured requests")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="mean prompt length")
    parser.add_argument("--prompt-spread", type=float, default=0.0, help="uniform +- fraction")
    parser.add_argument("--output-tokens", type=int, default=64, help="mean output length")
    parser.add_argument("--output-spread", type=float, default=0.0, help="uniform +- fraction")
    parser.add_argument(
        "--shared-prefix-ratio", type=float, default=0.0, help="fraction of each prompt shared"
    )
    parser.add_argument("--warmup", type=int, default=0, help="extra unmeasured requests first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=32000, help="token ids drawn below this")
    parser.add_argument("--text-prompts", action="store_true", help="send text, not token ids")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=SECONDS",
        help=f"goodput threshold, repeatable; METRIC is one of {', '.join(SLO_METRICS)}",
    )
    parser.add_argument("--json", type=Path, help="write the summary and per-request samples")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 when at least one request completed, 1 when none did, 2 on bad usage."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        slo = parse_slo(args.slo)
        workload = Workload(
            num_requests=args.num_requests,
            seed=args.seed,
            rate=args.rate,
            concurrency=args.concurrency,
            prompt_tokens=args.prompt_tokens,
            prompt_spread=args.prompt_spread,
            output_tokens=args.output_tokens,
            output_spread=args.output_spread,
            shared_prefix_ratio=args.shared_prefix_ratio,
            warmup_requests=args.warmup,
            vocab_size=args.vocab_size,
            timeout_s=args.timeout,
            text_prompts=args.text_prompts,
        )
    except ValueError as error:
        parser.error(str(error))
    results = asyncio.run(run_workload(args.url, args.model, workload))
    summary = summarize(results, slo, include_requests=args.json is not None)
    if args.json is not None:
        args.json.write_text(summary.to_json() + "\n")
        print(f"Wrote {args.json}", file=sys.stderr)
    print(format_summary(summary))
    return 0 if summary.completed else 1


if __name__ == "__main__":
    raise SystemExit(main())
