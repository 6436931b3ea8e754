"""Measuring a running engine's capacity under the spec's workload, with the load generator.

One call measures one engine start: a warm-up, optionally the engine's ceilings (once per
study), then the capacity search of `slotune.measure.capacity`, one probe per rate. A probe is an
open-loop stream at one rate in the workload's shape: a warm-up stretch that is not judged,
the judged window, extensions while the verdict is open, and a tail that keeps the load on
until the window's last request has finished (so the last requests are not measured on an
emptying engine). Between probes the engine drains and its prefix cache is reset.

The same search runs everywhere the tuner runs: `tune --local` calls `CapacityMeasure`, and in
the cluster the trial's load Job runs `slotune trial-load`, which calls it and hands the
result back as its termination message.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from slotune.engine import DEFAULT_KIND, engine_for
from slotune.engine.base import Engine
from slotune.measure import capacity, loadgen, scoring
from slotune.measure.capacity import (
    DECODE_CONCURRENCY,
    PREFILL_CONCURRENCY,
    Capacity,
    Ceiling,
    MeasureRequest,
    Probe,
    ProbeVerdict,
    QueueSample,
    SearchSettings,
    TargetFigures,
)
from slotune.measure.loadjob import LoadArgs
from slotune.measure.record import Measurement
from slotune.metrics import Exposition, MetricsUnavailable, ScrapeSource
from slotune.models import LLMDeploymentSpec, SloSpec, WorkloadSpec, seconds
from slotune.slo import attainment
from slotune.stats import percentile

WARMUP_REQUESTS = 4
"""Sent one at a time on a fresh engine before anything is measured (the first requests of a
new engine run slow), and timed to estimate an unloaded request's lifetime."""

DEFAULT_ENGINE = engine_for(DEFAULT_KIND)
"""Whose metric names a scrape reads when its caller names no engine."""


@dataclass(frozen=True)
class ProbeSettings:
    """How long probes run. The judged window lasts at least `floor_s` and `lifetimes` request
    lifetimes at that rate, and holds at least enough requests for a perfect run to resolve
    the strictest target; an open verdict extends it by its own length, `max_extensions`
    times at most."""

    floor_s: float = 30.0
    lifetimes: float = 4.0
    warmup_lifetimes: float = 2.0
    warmup_floor_s: float = 5.0
    max_extensions: int = 2
    confidence: float = attainment.CONFIDENCE
    sample_every_s: float = 1.0
    drain_timeout_s: float = 120.0
    request_timeout_s: float = 300.0


def _loadgen_workload(
    workload: WorkloadSpec,
    seed: int,
    count: int,
    rate: float | None,
    concurrency: int | None,
    *,
    cache_salt: str | None,
) -> loadgen.Workload:
    if workload.prompt_tokens is None or workload.output_tokens is None:
        raise ValueError("a measured workload needs promptTokens and outputTokens")
    return loadgen.Workload(
        num_requests=count,
        seed=seed,
        rate=rate,
        concurrency=concurrency,
        prompt_tokens=workload.prompt_tokens.mean,
        prompt_spread=workload.prompt_tokens.spread,
        output_tokens=workload.output_tokens.mean,
        output_spread=workload.output_tokens.spread,
        shared_prefix_ratio=workload.shared_prefix_ratio,
        cache_salt=cache_salt,
    )


def _finite(value: float) -> float | None:
    """Five significant digits (a record is read by people and fits a termination message);
    None for NaN."""
    return None if math.isnan(value) else float(f"{value:.5g}")


def _root(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix(loadgen.COMPLETIONS_PATH)


class _Engine:
    """The engine's own side of a probe: its queue gauges, draining, and what keeps one probe's
    prefix cache from the next (a salt per probe, or the engine's cache reset)."""

    def __init__(self, base_url: str, adapter: Engine = DEFAULT_ENGINE) -> None:
        self.root = _root(base_url)
        self.metrics = ScrapeSource(self.root + "/metrics", timeout=5.0)
        self.adapter = adapter
        self.reset_available: bool | None = None
        # Fresh for each measurement, so that no salt of an earlier one on the same engine
        # (a resumed trial's) matches.
        self._salt_base = uuid.uuid4().hex[:12] if adapter.salts_prefix_cache else None

    @property
    def salted(self) -> bool:
        return self._salt_base is not None

    def salt(self, phase: str) -> str | None:
        """The cache salt of one phase of the measurement (the warm-up, the ceilings, probe k):
        its requests hit only blocks cached by requests of the same phase. None where the
        engine takes no salt."""
        return None if self._salt_base is None else f"slotune-{self._salt_base}-{phase}"

    def _value(self, scrape: Exposition, signal: str) -> float | None:
        names = self.adapter.metrics.get(signal, ())
        return next((v for name in names if (v := scrape.value(name)) is not None), None)

    def sample(self, at: float) -> QueueSample | None:
        try:
            scrape = self.metrics.scrape()
        except MetricsUnavailable:
            return None
        waiting = self._value(scrape, "requests_waiting")
        if waiting is None:
            return None
        return QueueSample(
            at,
            waiting,
            self._value(scrape, "kv_cache_usage"),
            self._value(scrape, "preemptions"),
        )

    def spec_decode_tokens(self) -> tuple[float, float] | None:
        """(draft tokens proposed, accepted) so far, where the engine decodes speculatively."""
        try:
            scrape = self.metrics.scrape()
        except MetricsUnavailable:
            return None
        drafted = self._value(scrape, "spec_decode_drafted")
        accepted = self._value(scrape, "spec_decode_accepted")
        return None if drafted is None or accepted is None else (drafted, accepted)

    def _progress(self) -> tuple[float, float] | None:
        """(requests in the engine, tokens it has processed so far)."""
        try:
            scrape = self.metrics.scrape()
        except MetricsUnavailable:
            return None
        running = self._value(scrape, "requests_running")
        waiting = self._value(scrape, "requests_waiting")
        prompt = self._value(scrape, "prompt_tokens") or 0.0
        generated = self._value(scrape, "generation_tokens") or 0.0
        if running is None or waiting is None:
            return None
        return running + waiting, prompt + generated

    def drain(self, timeout: float) -> None:
        """Waits until the engine is idle: no request running or waiting, or (the gauges are
        only updated by engine steps) no token processed for a second."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            now = self._progress()
            if now is None or now[0] == 0 or (last is not None and now[1] == last[1]):
                return
            last = now
            time.sleep(1.0)

    def reset_prefix_cache(self) -> None:
        """The engine's cache reset, where it has one and takes no salt (SGLang's
        /flush_cache); where it answers 404 nothing keeps the probes apart, and the record
        says so."""
        path = self.adapter.cache_reset_path
        if path is None or self.reset_available is False:
            return
        url = self.root + path
        request = urllib.request.Request(url, method="POST")  # noqa: S310 - the engine's URL
        try:
            with urllib.request.urlopen(request, timeout=30):  # noqa: S310 - the engine's URL
                self.reset_available = True
        except (urllib.error.URLError, OSError):
            self.reset_available = False


class CapacityMeasure:
    """Measures an engine's capacity under the spec's workload and SLO."""

    def __init__(
        self,
        spec: LLMDeploymentSpec,
        served_name: str,
        *,
        probes: ProbeSettings | None = None,
        search: Callable[[float, Ceiling | None], SearchSettings] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if spec.slo is None:
            raise ValueError("tuning needs spec.slo")
        self.slo = spec.slo
        self.workload = spec.tuning.workload
        self.served_name = served_name
        self.adapter = engine_for(spec.engine.kind)
        self.probes = probes or ProbeSettings(floor_s=seconds(self.workload.duration))
        self.search = search or default_search
        self.log = log or (lambda _: None)

    def __call__(self, base_url: str, request: MeasureRequest) -> Measurement:
        return asyncio.run(self.measure(base_url, request))

    async def measure(self, base_url: str, request: MeasureRequest) -> Measurement:
        engine = self.engine(base_url)
        lifetime = await self.warm_up(base_url, engine.salt("warmup"))
        ceiling = request.ceiling
        if request.measure_ceiling:
            ceiling = await measure_ceiling(
                base_url, self.served_name, self.workload, engine, request.seed
            )
            self.log(
                f"ceiling: prefill {ceiling.prefill_tps:.0f} tok/s "
                f"({ceiling.prefill_rate:.3g} req/s), decode {ceiling.decode_tps:.0f} tok/s"
            )
        settings = self.search(request.target_rate, ceiling)
        if request.precise:
            settings = replace(settings, infeasible_precision=settings.precision)
        percentiles = {name: t.percentile for name, t in self.slo.targets().items()}
        drafts_before = engine.spec_decode_tokens()
        probes: list[Probe] = []
        while (k := capacity.next_index(settings, probes, percentiles)) is not None:
            run = await self.probe(
                base_url,
                engine,
                k=k,
                rate=settings.rate(k),
                seed=capacity.schedule_seed(request.seed, k),
                lifetime=lifetime,
            )
            probe, lifetime = run.probe, run.lifetime
            probes.append(probe)
            self.log(
                f"probe {settings.rate(k):.3g} req/s: {probe.verdict} "
                f"({probe.requests} requests, {probe.seconds:.0f}s"
                f"{', stopped once certain' if probe.stopped_early else ''})"
            )
        result = capacity.capacity_of(settings, probes, percentiles, spread=request.spread)
        measured = measurement_of(self.slo, result, ceiling, engine)
        acceptance = acceptance_rate(drafts_before, engine.spec_decode_tokens())
        return measured.model_copy(update={"spec_decode_acceptance": acceptance})

    def engine(self, base_url: str) -> _Engine:
        return _Engine(base_url, self.adapter)

    async def warm_up(self, base_url: str, cache_salt: str | None = None) -> float:
        """A few requests one at a time; returns the median unloaded lifetime (s)."""
        workload = _loadgen_workload(
            self.workload, 0, WARMUP_REQUESTS, None, 1, cache_salt=cache_salt
        )
        results = await loadgen.run_workload(base_url, self.served_name, workload)
        lifetimes = [r.e2e for r in results if r.ok]
        return percentile(lifetimes, 50) if lifetimes else 1.0

    def _window_requests(self, rate: float, lifetime: float) -> int:
        duration = max(self.probes.floor_s, self.probes.lifetimes * lifetime)
        z = attainment.z_value(self.probes.confidence)
        # Per-request targets need that many requests; a per-gap target (ITL) gets dozens of
        # samples from each request, so it never sets the count.
        per_request = [
            t.percentile
            for name, t in self.slo.targets().items()
            if attainment.SLO_METRICS[name].unit == "request"
        ]
        needed = attainment.requests_to_resolve(max(per_request), z) + 4 if per_request else 8
        return max(math.ceil(rate * duration), needed)

    async def probe(
        self, base_url: str, engine: _Engine, *, k: int, rate: float, seed: int, lifetime: float
    ) -> ProbeRun:
        """One probe at `rate` on the schedule of `seed`, under a cache salt of its own (or,
        where the engine takes none, its prefix cache reset afterwards); the engine drained
        afterwards."""
        window = self._window_requests(rate, lifetime)
        warmup = max(
            4,
            math.ceil(
                rate * max(self.probes.warmup_floor_s, self.probes.warmup_lifetimes * lifetime)
            ),
        )
        tail = math.ceil(rate * 3 * lifetime) + 4
        segments = [warmup, window] + [window] * self.probes.max_extensions + [tail]
        salt = engine.salt(f"p{k}")
        plans = loadgen.plan_requests(
            _loadgen_workload(self.workload, seed, sum(segments), rate, None, cache_salt=salt)
        )
        arrivals = capacity.scaled_arrivals(seed, rate, segments)
        began = time.perf_counter()
        results, verdict, extended, steady, stopped = await _run_probe(
            base_url,
            self.served_name,
            self.slo,
            engine,
            plans=plans,
            arrivals=arrivals,
            first=warmup,
            window=window,
            max_extensions=self.probes.max_extensions,
            settings=self.probes,
        )
        elapsed = time.perf_counter() - began
        await asyncio.to_thread(engine.drain, self.probes.drain_timeout_s)
        await asyncio.to_thread(engine.reset_prefix_cache)
        probe = probe_record(
            self.slo,
            k,
            rate,
            results,
            verdict=verdict,
            extended=extended,
            steady=steady,
            elapsed=elapsed,
            confidence=self.probes.confidence,
            stopped_early=stopped,
        )
        lifetimes = [r.e2e for r in results if r.ok]
        if lifetimes:
            lifetime = max(lifetime, percentile(lifetimes, 50))
        return ProbeRun(probe, results, window, lifetime)


@dataclass(frozen=True)
class ProbeRun:
    """A probe's record, its judged requests (the first `window` are the base window, the
    rest its extensions), and the request lifetime estimate it leaves for the next probe."""

    probe: Probe
    results: list[loadgen.RequestResult]
    window: int
    lifetime: float


@dataclass
class _Sent:
    """A probe's requests as they go: the tasks sent so far (in schedule order) and, by plan
    index, the streams still in flight."""

    plans: Sequence[loadgen.PlannedRequest]
    arrivals: Sequence[float]
    start: float
    clock: Callable[[], float]
    tasks: list[asyncio.Task[loadgen.RequestResult]] = field(default_factory=list)
    in_flight: dict[int, loadgen.StreamTally] = field(default_factory=dict)

    def finished(self, first: int, end: int, sending: asyncio.Task[None]) -> bool:
        """Whether every request of [first, end) was sent (or sending stopped) and finished."""
        sent = len(self.tasks) >= end or sending.done()
        return sent and all(t.done() for t in self.tasks[first:end])

    def certain_failure(self, slo: SloSpec, first: int, end: int, confidence: float) -> str:
        """`capacity.certain_failure` of the window [first, end) as it stands."""
        judged = self.tasks[first:end]
        finished = [t.result() for t in judged if t.done()]
        now = self.clock()
        running = [
            capacity.InFlight(now - tally.sent, tally.ttft)
            for plan in self.plans[first : first + len(judged)]
            if (tally := self.in_flight.get(plan.index)) is not None
        ]
        open_ = (end - first) - len(finished) - len(running)  # not sent, or not started yet
        return capacity.certain_failure(slo, finished, running, open_, confidence)

    def results(self, first: int, end: int) -> list[loadgen.RequestResult]:
        """The window's results so far: a request not finished is recorded as unfinished."""
        judged = self.tasks[first:end]
        return [
            t.result() if t.done() else self._unfinished(plan, at)
            for t, plan, at in zip(
                judged, self.plans[first:end], self.arrivals[first:end], strict=False
            )
        ]

    def _unfinished(self, plan: loadgen.PlannedRequest, at: float) -> loadgen.RequestResult:
        """A request the probe stopped waiting for: outside the bound for every target, with
        what had streamed by then."""
        now = self.clock()
        tally = self.in_flight.get(plan.index)
        sent = tally.sent if tally is not None else now
        return loadgen.RequestResult(
            index=plan.index,
            scheduled_at=at,
            sent_at=sent - self.start,
            e2e=now - sent,
            ttft=tally.ttft if tally is not None else None,
            itls=list(tally.itls) if tally is not None else [],
            prompt_tokens=plan.prompt_tokens,
            output_tokens=tally.output_tokens if tally is not None else 0,
            error=UNFINISHED,
        )


UNFINISHED = "unfinished: the probe stopped once its failure was certain"


async def _run_probe(
    base_url: str,
    model: str,
    slo: SloSpec,
    engine: _Engine,
    *,
    plans: Sequence[loadgen.PlannedRequest],
    arrivals: Sequence[float],
    first: int,
    window: int,
    max_extensions: int,
    settings: ProbeSettings,
) -> tuple[list[loadgen.RequestResult], ProbeVerdict, int, capacity.Stationarity, str]:
    """Sends the schedule open-loop until the judged window's verdict is in; returns the
    window's results, the verdict, how often it was extended, the steadiness check, and why
    the probe stopped early ("" if it did not). A window whose failure is certain before its
    requests have finished (`capacity.certain_failure`) stops there: its unfinished requests
    are recorded as such, and count against the attainment as any unfinished request does."""
    clock = time.perf_counter
    samples: list[QueueSample] = []
    stop = asyncio.Event()
    in_flight: dict[int, loadgen.StreamTally] = {}
    async with loadgen.sender(
        base_url, model, timeout_s=settings.request_timeout_s, clock=clock, in_flight=in_flight
    ) as send:
        sent = _Sent(plans, arrivals, clock(), clock, in_flight=in_flight)

        async def send_all() -> None:
            for plan, at in zip(plans, arrivals, strict=True):
                delay = sent.start + at - clock()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return
                sent.tasks.append(asyncio.create_task(send(plan, sent.start, at)))

        async def sample_all() -> None:
            while not stop.is_set():
                found = await asyncio.to_thread(engine.sample, clock() - sent.start)
                if found is not None:
                    samples.append(found)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), settings.sample_every_s)

        sending = asyncio.create_task(send_all())
        sampling = asyncio.create_task(sample_all())
        end = first + window
        extended = 0
        try:
            while True:
                stopped = ""
                while not stopped and not sent.finished(first, end, sending):
                    await asyncio.sleep(0.25)
                    stopped = sent.certain_failure(slo, first, end, settings.confidence)
                results = sent.results(first, end)
                last = arrivals[first + max(len(results), 1) - 1]
                steady = capacity.stationarity(samples, arrivals[first], last)
                if stopped:
                    return results, ProbeVerdict.FAIL, extended, steady, stopped
                verdict = capacity.probe_decision(
                    attainment.judge_requests(slo, results, settings.confidence),
                    steady,
                    can_extend=extended < max_extensions and end + window <= len(plans),
                )
                if verdict is not None:
                    return results, verdict, extended, steady, ""
                extended += 1
                end += window
        finally:
            stop.set()
            for task in sent.tasks:
                task.cancel()
            await asyncio.gather(sending, sampling, *sent.tasks, return_exceptions=True)


def probe_record(
    slo: SloSpec,
    k: int,
    rate: float,
    results: Sequence[loadgen.RequestResult],
    *,
    verdict: ProbeVerdict,
    extended: int,
    steady: capacity.Stationarity,
    elapsed: float,
    confidence: float = attainment.CONFIDENCE,
    stopped_early: str = "",
) -> Probe:
    """A probe reduced to what the record keeps."""
    ok = [r for r in results if r.ok]
    judged = attainment.judge_requests(slo, results, confidence)
    targets = {}
    for name, a in judged.items():
        values = [v for r in ok for v in attainment.SLO_METRICS[name].samples(r)]
        targets[name] = TargetFigures(
            good=a.good,
            total=a.total,
            low=round(a.low, 4),
            high=round(a.high, 4),
            effective=round(a.effective, 1) if a.effective is not None else None,
            value=_finite(percentile(values, a.percentile)) if values else None,
        )
    sends = [r.sent_at for r in results]
    span = max(sends) - min(sends) if len(sends) > 1 else 0.0
    done_at = [r.sent_at + r.e2e for r in ok]
    busy = (max(done_at) - min(sends)) if ok else 0.0
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [t for r in ok if r.output_tokens > 1 and (t := r.tpot) is not None]
    return Probe(
        k=k,
        rate=round(rate, 4),
        sent_rate=round((len(sends) - 1) / span, 4) if span > 0 else 0.0,
        verdict=verdict,
        requests=len(results),
        failed=len(results) - len(ok),
        seconds=round(elapsed, 1),
        extended=extended,
        targets=targets,
        ttft_p50=_finite(percentile(ttfts, 50)) if ttfts else None,
        ttft_p95=_finite(percentile(ttfts, 95)) if ttfts else None,
        tpot_p50=_finite(percentile(tpots, 50)) if tpots else None,
        tpot_p95=_finite(percentile(tpots, 95)) if tpots else None,
        output_tps=round(sum(r.output_tokens for r in ok) / busy, 2) if busy > 0 else 0.0,
        steady=steady.reason,
        preempted=steady.preempted,
        kv_peak=None if steady.kv_peak is None else round(steady.kv_peak, 4),
        stopped_early=stopped_early,
    )


def default_search(target: float, ceiling: Ceiling | None) -> SearchSettings:
    """Probes from the target rate; none above what the prefill ceiling allows (no
    configuration can prefill faster than the engine's saturated prefill), none below 1/8 of
    the target."""
    top = ceiling.prefill_rate * 1.05 if ceiling is not None and ceiling.prefill_rate else None
    return SearchSettings(
        target_rate=target,
        min_rate=target / 8,
        max_rate=top if top is not None and top > target else None,
    )


def measurement_of(
    slo: SloSpec, result: Capacity, ceiling: Ceiling | None, engine: _Engine
) -> Measurement:
    """The trial's measurement: its capacity, and the figures of its probe at the target rate
    (what status and events show beside the capacity)."""
    at_target = next((p for p in result.probes if p.k == 0), None)
    figures = at_target.targets if at_target else {}
    return Measurement(
        capacity=result,
        ceiling=ceiling,
        prefix_cache_reset=engine.reset_available,
        prefix_cache_salted=engine.salted,
        slo_percentiles={n: figures[n].value if n in figures else None for n in slo.targets()},
        ttft_p95=at_target.ttft_p95 if at_target else None,
        tpot_p95=at_target.tpot_p95 if at_target else None,
        request_throughput=at_target.sent_rate if at_target else 0.0,
        output_throughput=result.tokens_per_s,
        completed=sum(p.requests - p.failed for p in result.probes),
        failed=sum(p.failed for p in result.probes),
        send_rate=at_target.sent_rate if at_target else 0.0,
    )


# --- the ceilings ---------------------------------------------------------------------------

CEILING_SECONDS = 10.0


def _steady_rate(results: Sequence[loadgen.RequestResult], skip: int, tokens: str) -> float:
    """Tokens/s between the `skip`-th completion and the last, so the ramp is left out."""
    done = sorted((r.sent_at + r.e2e, r) for r in results if r.ok)
    if len(done) <= skip + 1:
        return 0.0
    begin = done[skip][0]
    end = done[-1][0]
    amount = sum(getattr(r, tokens) for _, r in done[skip + 1 :])
    return amount / (end - begin) if end > begin else 0.0


async def measure_ceiling(
    base_url: str, model: str, workload: WorkloadSpec, engine: _Engine | None = None, seed: int = 0
) -> Ceiling:
    """The engine's saturated prefill (the workload's prompts with max_tokens=1, closed loop)
    and decode (16-token prompts with long outputs) throughputs, each run for about
    CEILING_SECONDS after a calibration batch."""
    engine = engine or _Engine(base_url)
    if workload.prompt_tokens is None or workload.output_tokens is None:
        raise ValueError("a measured workload needs promptTokens and outputTokens")
    prefill_shape = loadgen.Workload(
        num_requests=PREFILL_CONCURRENCY * 3,
        seed=seed + 7,
        concurrency=PREFILL_CONCURRENCY,
        prompt_tokens=workload.prompt_tokens.mean,
        prompt_spread=workload.prompt_tokens.spread,
        output_tokens=1,
        # One salt for the calibration batch and the longer run below, which sends the same
        # prompts again (the same seed): as before salts, when nothing was reset between the
        # two, so the ceiling (and the example's scaling from it) reads as it did. With prefix
        # caching on, those repeats can hit the cache; a salt of its own for the longer run
        # would stop that, and move every scaled figure: it needs measuring first.
        cache_salt=engine.salt("prefill"),
    )
    results = await loadgen.run_workload(base_url, model, prefill_shape)
    calibrated = _steady_rate(results, PREFILL_CONCURRENCY, "prompt_tokens")
    wanted = int(calibrated * CEILING_SECONDS / workload.prompt_tokens.mean) if calibrated else 0
    if wanted > len(results):
        results = await loadgen.run_workload(
            base_url,
            model,
            loadgen.Workload(
                **{**prefill_shape.__dict__, "num_requests": wanted + PREFILL_CONCURRENCY}
            ),
        )
    prefill = _steady_rate(results, PREFILL_CONCURRENCY, "prompt_tokens")
    await asyncio.to_thread(engine.drain, 60.0)
    output = max(workload.output_tokens.mean * 2, 64)
    decode_shape = loadgen.Workload(
        num_requests=DECODE_CONCURRENCY * 2,
        seed=seed + 8,
        concurrency=DECODE_CONCURRENCY,
        prompt_tokens=16,
        output_tokens=output,
        cache_salt=engine.salt("decode"),
    )
    decoded = await loadgen.run_workload(base_url, model, decode_shape)
    decode = _steady_rate(decoded, DECODE_CONCURRENCY // 2, "output_tokens")
    await asyncio.to_thread(engine.drain, 60.0)
    await asyncio.to_thread(engine.reset_prefix_cache)
    return Ceiling(
        prefill_tps=round(prefill, 1),
        decode_tps=round(decode, 1),
        decode_concurrency=DECODE_CONCURRENCY,
        prompt_tokens=float(workload.prompt_tokens.mean),
    )


# --- the load Job ---------------------------------------------------------------------------


def trial_load_main(argv: list[str]) -> int:
    """`slotune trial-load`: what a trial's load Job runs in the cluster.

    Measures the capacity of the engine at --url under the workload and SLO, and writes the
    measurement as JSON to --result-file (the container's termination message, which the
    operator reads back from the pod's status) and to stdout.
    """
    args = LoadArgs.parse(argv, description=trial_load_main.__doc__)
    measure = CapacityMeasure(
        args.spec(), args.model, log=lambda line: print(line, file=sys.stderr, flush=True)
    )
    request = args.request
    measurement = measure(args.url, request)
    if args.quality is not None:
        measurement = gate_in_job(args, measurement)
    text = compact(measurement)
    if args.result_file is not None:
        args.result_file.write_text(text)
    sys.stdout.write(text + "\n")
    return 0


def acceptance_rate(
    before: tuple[float, float] | None, after: tuple[float, float] | None
) -> float | None:
    """Accepted over proposed draft tokens between two readings of the engine's counters; None
    where the engine proposed none (no speculative decoding)."""
    if before is None or after is None or after[0] - before[0] <= 0:
        return None
    return round((after[1] - before[1]) / (after[0] - before[0]), 4)


def gate_in_job(args: LoadArgs, measured: Measurement) -> Measurement:
    """The quality gate as a trial's load Job runs it: the reference's sequences taken from the
    serving engines, and the trial's engine held to them (nothing new is started)."""
    if args.quality is None:
        return measured
    if args.reference_url is None:
        return measured.model_copy(
            update={
                "quality_refused": "quality gate: no lossless reference engine (the serving "
                "configuration is itself lossy, or strategy InPlace runs the trial on the "
                "serving pods)"
            }
        )
    key = loadgen.api_key()
    try:
        reference = scoring.take_reference(
            scoring.Scorer(args.reference_url, args.model, key),
            args.quality,
            args.workload,
            args.request.seed,
        )
        figures = reference.hold(scoring.Scorer(args.url, args.model, key))
    except scoring.SCORING_ERRORS as error:
        return measured.model_copy(update={"quality_refused": scoring.not_scored(error)})
    return measured.gated(figures, args.quality)


TERMINATION_MESSAGE_BYTES = 4096


def compact(measurement: Measurement) -> str:
    """The measurement as JSON within a termination message's 4096 bytes: the probes' figures
    go first if it would not fit, then whole probes from the middle of the search (the
    bracket's two ends are kept)."""
    text = measurement.model_dump_json(exclude_none=True)
    if len(text.encode()) <= TERMINATION_MESSAGE_BYTES or measurement.capacity is None:
        return text
    result = measurement.capacity
    slim = [
        p.model_copy(update={"targets": {}, "steady": "", "stopped_early": ""})
        for p in result.probes
    ]
    while True:
        trimmed = measurement.model_copy(
            update={"capacity": result.model_copy(update={"probes": slim})}
        )
        text = trimmed.model_dump_json(exclude_none=True)
        if len(text.encode()) <= TERMINATION_MESSAGE_BYTES or len(slim) <= 2:
            return text
        slim = slim[:1] + slim[2:]
