"""A probe far past a configuration's capacity stops once its failure is certain: the rule
(`capacity.certain_failure`), its soundness against every way the unfinished requests could
still end, and a probe against a scripted server that serves one request at a time."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from aiohttp import web

from slotune.measure.capacity import InFlight, ProbeVerdict, certain_failure
from slotune.measure.probe import UNFINISHED, CapacityMeasure, ProbeSettings
from slotune.models import LLMDeploymentSpec, SloSpec
from slotune.slo.attainment import Verdict, combine, judge_requests
from support.outcomes import Result
from support.streaming import serving, sse

TTFT_2S = SloSpec.model_validate({"ttft": {"percentile": 95, "maxSeconds": 2.0}})


def good() -> Result:
    return Result(ttft=0.5, e2e=1.0)


def late() -> Result:
    return Result(ttft=3.0, e2e=4.0)


def test_a_backlog_of_late_requests_is_a_certain_failure() -> None:
    # 30 finished within the bound, 70 queued for longer than the TTFT bound: at best 30%.
    reason = certain_failure(TTFT_2S, [good()] * 30, [InFlight(age=2.5)] * 70, unsent=0)
    assert "stopped early: 70 unfinished requests already past the ttft bound" in reason
    assert "at best 30 of 100" in reason


def test_requests_that_may_still_be_in_time_are_given_the_benefit_of_the_doubt() -> None:
    # The same queue, but not yet past the bound: every one could still get its first token.
    assert certain_failure(TTFT_2S, [good()] * 30, [InFlight(age=1.5)] * 70, unsent=0) == ""
    # Unsent requests count as within the bound too.
    assert certain_failure(TTFT_2S, [late()] * 10, [], unsent=90) == ""
    # A first token that came in time is in time whatever the request's age.
    in_time = [InFlight(age=9.0, ttft=0.4)] * 70
    assert certain_failure(TTFT_2S, [good()] * 30, in_time, unsent=0) == ""


def test_only_targets_an_unfinished_request_can_already_miss_stop_a_probe() -> None:
    # TPOT is known only at the end of a request: no backlog decides it early.
    tpot = SloSpec.model_validate({"tpot": {"percentile": 95, "maxSeconds": 0.05}})
    assert certain_failure(tpot, [], [InFlight(age=60.0)] * 100, unsent=0) == ""
    e2e = SloSpec.model_validate({"e2e": {"percentile": 90, "maxSeconds": 10.0}})
    assert "e2e bound" in certain_failure(e2e, [], [InFlight(age=11.0)] * 100, unsent=0)


def test_a_small_window_is_never_stopped_early() -> None:
    assert certain_failure(TTFT_2S, [late()] * 19, [], unsent=0) == ""


def test_a_certain_failure_is_a_failure_however_the_rest_ends() -> None:
    """Soundness: wherever the rule stops a window, every way of finishing it (the unfinished
    requests in time or late, in any order) is judged Fail by the full rule."""
    rng = random.Random(3)  # noqa: S311 - reproducible cases, not secrets
    stopped = 0
    for _ in range(400):
        size = rng.randint(20, 200)
        finished_count = rng.randint(0, size)
        finished: list[Any] = [good() if rng.random() < rng.random() else late()
                               for _ in range(finished_count)]  # fmt: skip
        running = rng.randint(0, size - finished_count)
        unsent = size - finished_count - running
        flights = [InFlight(age=rng.uniform(0, 4)) for _ in range(running)]
        if not certain_failure(TTFT_2S, finished, flights, unsent):
            continue
        stopped += 1
        for ending in range(20):
            # A known-late request ends late; the rest end in time, late, or in runs.
            rest: list[Any] = [late() if f.age > 2.0 or rng.random() < ending / 20 else good()
                               for f in flights]  # fmt: skip
            rest += [good() if rng.random() < 0.9 else late() for _ in range(unsent)]
            order = finished + rest
            if ending % 2:
                order.sort(key=lambda r: r.ttft)  # the most clustered order
            else:
                rng.shuffle(order)
            verdict = combine([a.verdict for a in judge_requests(TTFT_2S, order).values()])
            assert verdict == Verdict.FAIL
    assert stopped > 50  # the rule did stop many of the windows it was shown


# --- a probe against a server that serves one request at a time ---------------------------------

SERVICE_SECONDS = 0.05


def one_at_a_time_app(received: list[dict[str, Any]] | None = None) -> web.Application:
    """Each request holds the whole server for SERVICE_SECONDS, then streams two tokens:
    20 requests/s at most, so a higher rate queues without bound. Request bodies go to
    `received`."""
    lock = asyncio.Lock()

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if received is not None:
            received.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            async with lock:
                await asyncio.sleep(SERVICE_SECONDS)
                for ids in ([1], [2]):
                    choice = {"index": 0, "text": "x", "token_ids": ids}
                    await response.write(sse({"choices": [choice]}))
            await response.write(b"data: [DONE]\n\n")
        except ConnectionResetError:  # the probe hung up: it stopped waiting for this one
            pass
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


def probe_at(rate: float) -> Any:
    measure = CapacityMeasure(tiny_spec(rate), "tiny", probes=PROBE_SETTINGS)

    async def go() -> Any:
        async with serving(one_at_a_time_app(), handler_cancellation=True) as url:
            engine = measure.engine(url)
            return await measure.probe(url, engine, k=0, rate=rate, seed=1, lifetime=0.05)

    return asyncio.run(go())


PROBE_SETTINGS = ProbeSettings(floor_s=2.0, warmup_floor_s=1.0, max_extensions=0)


def tiny_spec(rate: float, kind: str = "vllm") -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "tiny"},
            "engine": {"kind": kind},
            "slo": {"ttft": {"percentile": 90, "maxSeconds": 0.5}},
            "tuning": {"workload": {"source": "Synthetic", "promptTokens": {"mean": 8},
                                    "outputTokens": {"mean": 2}, "requestRate": rate}},
        }
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_each_probe_keeps_its_prefix_cache_to_itself_with_a_salt_of_its_own(kind: str) -> None:
    """Probes of one engine start send the same prompts at different rates. On vLLM each
    probe's requests carry one salt, another probe's another, and a later measurement of the
    same engine new ones, so that no probe hits blocks an earlier one cached; SGLang takes no
    salt (its cache is flushed between probes instead)."""
    received: list[dict[str, Any]] = []
    measure = CapacityMeasure(tiny_spec(10.0, kind), "tiny", probes=PROBE_SETTINGS)

    async def go() -> None:
        async with serving(one_at_a_time_app(received), handler_cancellation=True) as url:
            # vLLM: two measurements of one engine, two probes each; SGLang: one probe shows it
            for _ in range(2 if kind == "vllm" else 1):
                engine = measure.engine(url)
                for k in (0, 3) if kind == "vllm" else (0,):
                    rate = 10.0 * 1.4 ** (k / 3)
                    await measure.probe(url, engine, k=k, rate=rate, seed=1, lifetime=0.05)

    asyncio.run(go())
    salts = [body.get("cache_salt") for body in received]
    if kind == "sglang":
        assert set(salts) == {None}
        return
    runs = [salts[0]]
    for salt in salts[1:]:
        if salt != runs[-1]:
            runs.append(salt)
    assert None not in runs
    assert len(runs) == len(set(runs)) == 4, runs  # one salt per probe, never reused


def test_a_probe_far_past_capacity_stops_without_draining_its_backlog() -> None:
    # 60 requests/s against 20 served: the queue grows by 40 a second, and every request
    # that waits 0.5 s is known to miss the TTFT bound (p90 of 0.5 s) before it has finished.
    run = probe_at(60.0)
    probe = run.probe
    assert probe.verdict == ProbeVerdict.FAIL
    assert probe.stopped_early.startswith("stopped early:")
    unfinished = [r for r in run.results if r.error == UNFINISHED]
    assert unfinished, "the probe waited for every request"
    assert probe.failed == len(unfinished)  # they count against the attainment
    assert probe.requests <= run.window


def test_a_probe_within_capacity_runs_to_its_end() -> None:
    run = probe_at(10.0)
    assert run.probe.verdict == ProbeVerdict.PASS
    assert run.probe.stopped_early == ""
    assert all(r.error is None for r in run.results)
    assert len(run.results) == run.window


def test_a_window_with_no_sample_of_a_metric_is_not_a_crash() -> None:
    """One-token answers have no TPOT sample: the early stop judges only what has samples."""
    tpot = SloSpec.model_validate({"tpot": {"percentile": 95, "maxSeconds": 0.05}})
    one_token = [Result(ttft=0.5, e2e=0.6, output_tokens=1)] * 30
    assert certain_failure(tpot, one_token, [], unsent=0) == ""
    errored = [Result(ttft=None, e2e=0.1, error="HTTP 500")] * 30
    assert "stopped early" in certain_failure(tpot, errored, [], unsent=0)
