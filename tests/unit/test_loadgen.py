import asyncio
import itertools
import json
import math
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from slotune.measure.loadgen import (
    RequestResult,
    Workload,
    arrival_times,
    completions_url,
    main,
    meets_slo,
    parse_slo,
    plan_requests,
    request_body,
    run_workload,
    summarize,
)
from support.streaming import serving, sse


def result(
    index: int = 0,
    *,
    ttft: float | None = 0.1,
    e2e: float = 1.0,
    output_tokens: int = 10,
    itls: list[float] | None = None,
    sent_at: float = 0.0,
    scheduled_at: float = 0.0,
    error: str | None = None,
) -> RequestResult:
    return RequestResult(
        index=index,
        scheduled_at=scheduled_at,
        sent_at=sent_at,
        e2e=e2e,
        ttft=ttft,
        itls=itls if itls is not None else [0.1] * (output_tokens - 1),
        prompt_tokens=100,
        output_tokens=output_tokens,
        error=error,
    )


# --- plan -----------------------------------------------------------------------------------


def test_arrivals_are_poisson_at_the_requested_rate_and_fixed_by_the_seed() -> None:
    workload = Workload(num_requests=20_000, rate=50.0, seed=7)
    times = arrival_times(workload)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert times[0] == 0
    assert all(gap >= 0 for gap in gaps)
    assert len(gaps) / times[-1] == pytest.approx(50.0, rel=0.03)
    # exponential gaps: the standard deviation equals the mean, and P(gap > mean) = 1/e
    gap_mean = sum(gaps) / len(gaps)
    gap_std = math.sqrt(sum((g - gap_mean) ** 2 for g in gaps) / len(gaps))
    assert gap_std == pytest.approx(gap_mean, rel=0.05)
    assert sum(g > gap_mean for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.02)
    assert arrival_times(workload) == times
    assert arrival_times(Workload(num_requests=20_000, rate=50.0, seed=8)) != times


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_times(Workload(num_requests=5, rate=math.inf)) == [0.0] * 5


def test_lengths_stay_within_the_spread_and_use_all_of_it() -> None:
    workload = Workload(
        num_requests=2000,
        concurrency=1,
        prompt_tokens=100,
        prompt_spread=0.5,
        output_tokens=20,
        output_spread=0.25,
    )
    plans = plan_requests(workload)
    prompts = [p.prompt_tokens for p in plans]
    outputs = [p.output_tokens for p in plans]
    assert min(prompts) == 50
    assert max(prompts) == 150
    assert min(outputs) == 15
    assert max(outputs) == 25
    assert all(len(p.prompt) == p.prompt_tokens for p in plans)
    assert sum(prompts) / len(prompts) == pytest.approx(100, rel=0.03)


def test_no_spread_gives_exact_lengths() -> None:
    plans = plan_requests(Workload(num_requests=10, rate=1.0, prompt_tokens=33, output_tokens=7))
    assert {(p.prompt_tokens, p.output_tokens) for p in plans} == {(33, 7)}


def test_shared_prefix_is_shared_and_the_rest_is_not() -> None:
    workload = Workload(
        num_requests=50,
        rate=1.0,
        prompt_tokens=200,
        prompt_spread=0.2,
        shared_prefix_ratio=0.5,
        vocab_size=50_000,
        seed=3,
    )
    plans = plan_requests(workload)
    prompts = [p.prompt for p in plans if isinstance(p.prompt, list)]
    assert len(prompts) == len(plans)
    prefixes = [int(0.5 * p.prompt_tokens) for p in plans]
    assert min(prefixes) < max(prefixes)  # the spread makes prefix lengths differ
    longest = prompts[prefixes.index(max(prefixes))][: max(prefixes)]
    for prompt, prefix in zip(prompts, prefixes, strict=True):
        assert prompt[:prefix] == longest[:prefix]  # every prefix is the same sequence
    # the suffixes differ between requests (random ids from a 50k vocabulary)
    suffix_starts = {tuple(p[int(0.5 * len(p)) : int(0.5 * len(p)) + 8]) for p in prompts}
    assert len(suffix_starts) == len(prompts)
    assert all(10 <= t < 50_000 for p in prompts for t in p)


def test_no_shared_prefix_means_prompts_differ_from_the_first_token() -> None:
    plans = plan_requests(Workload(num_requests=20, rate=1.0, prompt_tokens=50, seed=1))
    assert len({tuple(p.prompt[:4]) for p in plans if isinstance(p.prompt, list)}) == 20


def test_plan_is_reproducible_and_warmups_come_first() -> None:
    workload = Workload(num_requests=5, warmup_requests=3, rate=2.0, seed=11)
    plans = plan_requests(workload)
    assert len(plans) == 8
    assert [p.index for p in plans] == list(range(8))
    assert plan_requests(workload) == plans


def test_text_prompts_are_text() -> None:
    plans = plan_requests(Workload(num_requests=3, rate=1.0, prompt_tokens=12, text_prompts=True))
    assert all(isinstance(p.prompt, str) and len(p.prompt.split()) == 12 for p in plans)


def test_request_body_forces_the_output_length_and_streams_token_ids() -> None:
    plan = plan_requests(Workload(num_requests=1, rate=1.0, prompt_tokens=4, output_tokens=9))[0]
    body = request_body("m", plan)
    assert body["prompt"] == plan.prompt
    assert body["max_tokens"] == body["min_tokens"] == 9
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["return_token_ids"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "cache_salt" not in body  # vLLM's field: sent only when a salt is asked for


def test_a_salted_workload_sends_its_salt_with_every_request() -> None:
    workload = Workload(num_requests=3, warmup_requests=1, rate=1.0, cache_salt="slotune-ab-p4")
    assert {request_body("m", plan)["cache_salt"] for plan in plan_requests(workload)} == {
        "slotune-ab-p4"
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of rate and concurrency"),
        ({"rate": 1.0, "concurrency": 2}, "exactly one of rate and concurrency"),
        ({"rate": 0.0}, "rate must be > 0"),
        ({"concurrency": 1, "prompt_spread": 1.0}, "prompt_spread"),
        ({"concurrency": 1, "shared_prefix_ratio": 1.5}, "shared_prefix_ratio"),
        ({"concurrency": 1, "vocab_size": 5}, "vocab_size"),
        ({"concurrency": 1, "cache_salt": "a/b"}, "cache_salt"),
        ({"concurrency": 1, "cache_salt": ""}, "cache_salt"),
        ({"concurrency": 1, "cache_salt": "x" * 129}, "cache_salt"),
    ],
)
def test_workload_refuses_what_cannot_run(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Workload(**kwargs)


def test_completions_url_accepts_a_base_or_full_url() -> None:
    assert completions_url("http://h:8000") == "http://h:8000/v1/completions"
    assert completions_url("http://h:8000/") == "http://h:8000/v1/completions"
    assert completions_url("http://h:8000/v1/completions") == "http://h:8000/v1/completions"


# --- summarize ------------------------------------------------------------------------------


def test_single_token_output_has_tpot_zero_and_counts_as_meeting_tpot() -> None:
    one = result(ttft=0.2, e2e=0.2, output_tokens=1, itls=[])
    assert one.tpot == 0
    assert one.max_itl == 0
    summary = summarize([one], {"tpot": 0.001})
    assert summary.tpot.p50 == 0
    assert summary.good_requests == 1


def test_tpot_spreads_decode_time_over_the_tokens_after_the_first() -> None:
    assert result(ttft=0.5, e2e=2.5, output_tokens=5).tpot == pytest.approx(0.5)


def test_summary_percentiles_throughput_and_goodput_from_hand_made_results() -> None:
    # ttft 0.1..1.0 s, e2e 1.1..2.0 s, 11 output tokens each, sent one per 0.1 s
    results = [
        result(
            i,
            ttft=0.1 * (i + 1),
            e2e=1.1 + 0.1 * i,
            output_tokens=11,
            sent_at=0.1 * i,
            itls=[0.05] * 9 + [0.1 * (i + 1)],
        )
        for i in range(10)
    ]
    results.append(result(10, ttft=None, e2e=0.5, sent_at=1.0, error="HTTP 500: boom"))
    summary = summarize(results, {"ttft": 0.55, "itl": 0.45})

    assert summary.completed == 10
    assert summary.failed == 1
    assert summary.errors == {"HTTP 500: boom": 1}
    assert summary.duration_s == pytest.approx(0.9 + 2.0)  # last send + its e2e
    assert summary.request_throughput == pytest.approx(10 / 2.9)
    assert summary.output_throughput == pytest.approx(110 / 2.9)
    assert summary.input_throughput == pytest.approx(1000 / 2.9)
    assert summary.ttft.mean == pytest.approx(0.55)
    assert summary.ttft.p50 == pytest.approx(0.55)
    assert summary.ttft.p90 == pytest.approx(0.91)
    assert summary.ttft.p99 == pytest.approx(0.991)
    assert summary.e2e.p95 == pytest.approx(1.955)
    assert summary.tpot.p50 == pytest.approx(summarize(results[4:6]).tpot.mean)
    # ITL percentiles pool every gap of every completed request: 90 of 0.05, then 0.1..1.0
    assert summary.itl.p50 == pytest.approx(0.05)
    assert summary.itl.p99 == pytest.approx(0.901)
    # good: ttft <= 0.55 and max itl <= 0.45 -> requests 0..3 (request 4 has itl 0.5)
    assert summary.good_requests == 4
    assert summary.goodput == pytest.approx(4 / 2.9)


def test_goodput_needs_every_slo_and_failed_requests_are_never_good() -> None:
    fast = result(ttft=0.1, e2e=1.0, output_tokens=10)
    slow_e2e = result(1, ttft=0.1, e2e=9.0, output_tokens=10)
    failed = result(2, ttft=0.1, e2e=0.2, output_tokens=2, error="stream error: x")
    summary = summarize([fast, slow_e2e, failed], {"ttft": 1.0, "e2e": 2.0})
    assert summary.good_requests == 1
    assert summarize([fast]).goodput is None
    with pytest.raises(ValueError, match="unknown SLO metric"):
        summarize([fast], {"e2el": 1.0})


def test_scheduling_lag_and_send_rate_are_reported() -> None:
    results = [result(i, sent_at=i * 0.5 + 0.001 * i, scheduled_at=i * 0.5) for i in range(101)]
    summary = summarize(results)
    assert summary.scheduling_lag.p50 == pytest.approx(0.05)
    assert summary.scheduling_lag.p99 == pytest.approx(0.099)
    assert summary.scheduling_lag.max == pytest.approx(0.1)
    assert summary.send_rate == pytest.approx(100 / 50.1)


def test_summary_is_json_with_optional_samples_and_no_nan() -> None:
    failed_only = [result(ttft=None, e2e=1.0, error="ClientConnectorError")]
    summary = summarize(failed_only, include_requests=True)
    data = json.loads(summary.to_json())
    assert data["ttft"]["p99"] is None
    assert data["requests"][0]["error"] == "ClientConnectorError"
    assert data["requests"][0]["tpot"] is None
    assert "requests" not in json.loads(summary.to_json(samples=False))
    assert summarize([]).request_throughput == 0


def test_parse_slo_reads_seconds_and_refuses_nonsense() -> None:
    assert parse_slo(["ttft=2.0", "tpot=0.05"]) == {"ttft": 2.0, "tpot": 0.05}
    with pytest.raises(ValueError, match="METRIC=SECONDS"):
        parse_slo(["ttft"])
    with pytest.raises(ValueError, match="not a number"):
        parse_slo(["ttft=fast"])
    with pytest.raises(ValueError, match="unknown SLO metric"):
        parse_slo(["latency=1"])


# --- against a tiny streaming server --------------------------------------------------------

FIRST_TOKEN_DELAY = 0.08
TOKEN_GAP = 0.03
CHUNKS = [[101], [102, 103], [104], [105]]  # 5 tokens in 4 chunks: 3 gaps


def streaming_app(received: list[dict[str, Any]]) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        received.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(FIRST_TOKEN_DELAY)
        for index, ids in enumerate(CHUNKS):
            if index:
                await asyncio.sleep(TOKEN_GAP)
            choice = {"index": 0, "text": "x" * len(ids), "token_ids": ids}
            await response.write(sse({"choices": [choice]}))
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 5}
        await response.write(sse({"choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


def run_against(app: web.Application, workload: Workload) -> list[RequestResult]:
    async def go() -> list[RequestResult]:
        async with serving(app) as url:
            return await run_workload(url, "tiny", workload)

    return asyncio.run(go())


def test_timing_and_token_counts_against_a_streaming_server() -> None:
    received: list[dict[str, Any]] = []
    workload = Workload(
        num_requests=6, warmup_requests=2, concurrency=3, prompt_tokens=16, output_tokens=5
    )
    results = run_against(streaming_app(received), workload)

    assert len(received) == 8  # the warm-ups were sent
    assert len(results) == 6  # and left out
    assert [r.index for r in results] == list(range(2, 8))
    for r in results:
        assert r.error is None
        assert r.output_tokens == 5
        assert r.prompt_tokens == 16
        assert r.ttft is not None
        assert FIRST_TOKEN_DELAY - 0.002 <= r.ttft <= FIRST_TOKEN_DELAY + 0.06
        assert len(r.itls) == 3  # one gap per token-carrying chunk, not per token
        assert all(TOKEN_GAP - 0.002 <= gap <= TOKEN_GAP + 0.04 for gap in r.itls)
        assert r.e2e >= r.ttft + sum(r.itls) - 1e-6
        assert r.tpot == pytest.approx((r.e2e - r.ttft) / 4)
        assert 0 <= r.scheduling_lag < 0.05


def test_server_errors_become_results_and_the_run_finishes() -> None:
    async def failing(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text="overloaded")

    broken = web.Application()
    broken.router.add_post("/v1/completions", failing)
    workload = Workload(num_requests=4, rate=200.0, prompt_tokens=8, output_tokens=5)
    results = run_against(broken, workload)
    assert [r.error for r in results] == ["HTTP 503: overloaded"] * 4
    assert summarize(results).failed == 4


def test_unreachable_server_is_an_error_not_a_crash() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now
    workload = Workload(num_requests=2, rate=100.0, prompt_tokens=4, output_tokens=2, timeout_s=5)
    results = asyncio.run(run_workload(f"http://127.0.0.1:{port}", "m", workload))
    assert len(results) == 2
    assert all(r.error and "Connect" in r.error for r in results)


def test_usage_counts_tokens_when_chunks_carry_no_token_ids() -> None:
    async def text_only(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(3):
            await response.write(sse({"choices": [{"index": 0, "text": "ab"}]}))
        await response.write(sse({"choices": [], "usage": {"completion_tokens": 6}}))
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", text_only)
    results = run_against(app, Workload(num_requests=1, concurrency=1, prompt_tokens=4))
    assert results[0].error is None
    assert results[0].output_tokens == 6
    assert len(results[0].itls) == 2


def test_open_loop_sends_on_schedule_even_when_responses_are_slow() -> None:
    received: list[dict[str, Any]] = []
    # responses take ~0.17 s; arrivals every ~25 ms on average must not wait for them
    workload = Workload(num_requests=12, rate=40.0, prompt_tokens=4, output_tokens=5, seed=2)
    results = run_against(streaming_app(received), workload)
    schedule = arrival_times(workload)
    assert [r.scheduled_at for r in results] == schedule
    assert all(r.error is None for r in results)
    assert max(r.scheduling_lag for r in results) < 0.05
    assert results[-1].sent_at < schedule[-1] + 0.05


def test_cli_writes_json_and_prints_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[dict[str, Any]] = []

    async def fake_run(url: str, model: str, workload: Workload) -> list[RequestResult]:
        async with serving(streaming_app(received)) as base:
            return await run_workload(base, model, workload)

    monkeypatch.setattr("slotune.measure.loadgen.run_workload", fake_run)
    out = tmp_path / "run.json"
    argv = ["--url", "unused", "--model", "tiny", "--concurrency", "2", "--num-requests", "3"]
    argv += ["--prompt-tokens", "8", "--slo", "ttft=2.0", "--slo", "tpot=0.5", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["completed"] == 3
    assert data["good_requests"] == 3
    assert len(data["requests"]) == 3
    printed = capsys.readouterr().out
    assert "goodput" in printed
    assert "ttft" in printed
    assert received[0]["model"] == "tiny"


def test_cli_refuses_rate_and_concurrency_together() -> None:
    with pytest.raises(SystemExit):
        main(["--url", "u", "--model", "m", "--rate", "1", "--concurrency", "1"])


def test_the_api_key_in_vllms_variable_is_sent_as_a_bearer_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine started with VLLM_API_KEY refuses /v1 without it; a load Job has the same
    variable from the same Secret, and sends it."""
    seen: list[str | None] = []

    async def guarded(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.Response(status=401, text='{"error": "Unauthorized"}')
        return web.Response(status=503, text="overloaded")  # past the key check

    def app() -> web.Application:  # one per event loop
        served = web.Application()
        served.router.add_post("/v1/completions", guarded)
        return served

    workload = Workload(num_requests=1, rate=200.0, prompt_tokens=8, output_tokens=5)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert [r.error for r in run_against(app(), workload)] == [
        'HTTP 401: {"error": "Unauthorized"}'
    ]
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    assert [r.error for r in run_against(app(), workload)] == ["HTTP 503: overloaded"]
    assert seen == [None, "Bearer s3cret"]


def test_goodput_and_attainment_read_the_same_samples() -> None:
    """One SLO rule: a request is good for a metric exactly when the attainment rule counts
    every one of its samples within the bound (every gap, for ITL)."""
    from slotune.slo.attainment import per_request  # noqa: PLC0415

    steady = result(ttft=0.1, e2e=0.5, itls=[0.02, 0.03, 0.02], output_tokens=4)
    stall = result(ttft=0.1, e2e=0.6, itls=[0.02, 0.09, 0.02], output_tokens=4)
    one_token = result(ttft=0.1, e2e=0.1, itls=[], output_tokens=1)
    for one in (steady, stall, one_token):
        for name, limit in (("itl", 0.05), ("tpot", 0.05), ("ttft", 0.2)):
            ((good, total),) = per_request(name, [one], limit)
            assert meets_slo(one, {name: limit}) == (good == total), (one, name)
    assert not meets_slo(stall, {"itl": 0.05})
    assert meets_slo(one_token, {"tpot": 0.05, "ttft": 0.2})
