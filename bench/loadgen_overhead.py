"""How much of what the load generator reports is the generator itself.

Prints two tables, measured against a trivial streaming endpoint on 127.0.0.1 that runs in its
own process pinned to one core, with the generator pinned to the other:

1. Timing error: the endpoint sleeps a known delay before the first token and a known gap
   between tokens, and records when it actually wrote each chunk. The table gives the
   generator's TTFT and ITL minus the nominal values and minus the server-observed ones (the
   latter is the client side alone: loopback, HTTP parsing, the client's event loop).
2. Sustained rate: open-loop Poisson arrivals, stepping the rate up, against an endpoint that
   answers at once with two tokens. A step is sustained when the completed-request rate is at
   least 95% of the schedule's own rate (so Poisson noise in a short schedule does not count
   against the generator) and the p99 scheduling lag is under 10 ms. CPU columns say which side
   ran out of core; "other" is CPU taken on the two cores by anything else (other processes,
   the network stack, steal), which makes a run on a shared machine read low.

Bounded: about a minute and a half, stops by itself, only 127.0.0.1.
Run: .venv/bin/python bench/loadgen_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from aiohttp import web

from slotune.measure.loadgen import (
    RequestResult,
    Workload,
    arrival_times,
    plan_requests,
    run_workload,
    summarize,
)
from slotune.stats import mean, percentile

FIRST_TOKEN_DELAY = 0.050
TOKEN_GAP = 0.010
TIMED_TOKENS = 20
RATE_STEPS = (100, 200, 400, 700, 1000, 1400, 1800, 2400, 3000, 4000)
STEP_SECONDS = 3.0
DEADLINE_SECONDS = 100.0
SERVER_CORE, CLIENT_CORE = 1, 0


# --- the endpoint, in its own process -------------------------------------------------------


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _key(prompt: list[int]) -> str:
    return ",".join(map(str, prompt[:8]))


def _endpoint() -> web.Application:
    observed: dict[str, dict[str, Any]] = {}

    async def stream(request: web.Request, tokens: int, first: float, gap: float) -> Any:
        entered = time.perf_counter()
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        writes = []
        if first:
            await asyncio.sleep(first)
        for index in range(tokens):
            if index and gap:
                await asyncio.sleep(gap)
            choice = {"index": 0, "text": "x", "token_ids": [index]}
            await response.write(_sse({"choices": [choice]}))
            writes.append(time.perf_counter())
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": tokens}
        await response.write(_sse({"choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        if first:
            gaps = [b - a for a, b in itertools.pairwise(writes)]
            observed[_key(body["prompt"])] = {"ttft": writes[0] - entered, "gaps": gaps}
        return response

    async def timed(request: web.Request) -> Any:
        return await stream(request, TIMED_TOKENS, FIRST_TOKEN_DELAY, TOKEN_GAP)

    async def fast(request: web.Request) -> Any:
        return await stream(request, 2, 0.0, 0.0)

    async def stats(request: web.Request) -> web.Response:
        data = dict(observed)
        observed.clear()
        return web.json_response(data)

    app = web.Application()
    app.router.add_post("/timed/v1/completions", timed)
    app.router.add_post("/fast/v1/completions", fast)
    app.router.add_get("/stats", stats)
    return app


def _serve(conn: Connection) -> None:
    os.sched_setaffinity(0, {SERVER_CORE})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    conn.send(sock.getsockname()[1])
    web.run_app(_endpoint(), sock=sock, print=None, access_log=None, backlog=1024)


# --- the generator side ---------------------------------------------------------------------


def _cores_busy_seconds() -> float:
    """CPU time spent on both pinned cores by anyone (steal included), from /proc/stat."""
    total = 0.0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name in (f"cpu{SERVER_CORE}", f"cpu{CLIENT_CORE}"):
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, values[:8])
            total += user + nice + system + irq + softirq + steal
    return total / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _server_observed(base: str) -> dict[str, Any]:
    import aiohttp  # noqa: PLC0415 - only the stats fetch needs the client directly

    async with aiohttp.ClientSession() as session, session.get(base + "/stats") as response:
        data: dict[str, Any] = await response.json()
        return data


def _ms(values: list[float]) -> str:
    cells = (mean(values), percentile(values, 50), percentile(values, 99))
    return "".join(f"{v * 1000:>9.3f}" for v in cells)


def timing_error(base: str) -> None:
    print(
        f"\n(1) Timing error, ms. Endpoint: first token after {FIRST_TOKEN_DELAY * 1000:.0f} ms, "
        f"then {TIMED_TOKENS - 1} gaps of {TOKEN_GAP * 1000:.0f} ms (one token per chunk)."
    )
    print(f"{'load':<22}{'metric':<22}{'mean':>9}{'p50':>9}{'p99':>9}")
    for label, rate, count in (("20 req/s (~5 live)", 20.0, 100), ("200 req/s (~50)", 200.0, 800)):
        workload = Workload(num_requests=count, rate=rate, prompt_tokens=32, output_tokens=20)
        results = asyncio.run(run_workload(base + "/timed", "bench", workload))
        observed = asyncio.run(_server_observed(base))
        done = [r for r in results if r.ok and r.ttft is not None]
        prompts = {p.index: p.prompt for p in plan_requests(workload)}
        ttft_nominal, ttft_server, itl_nominal, itl_server = [], [], [], []
        for r in done:
            prompt = prompts[r.index]
            seen = observed.get(_key(prompt)) if isinstance(prompt, list) else None
            if r.ttft is None:
                continue
            ttft_nominal.append(r.ttft - FIRST_TOKEN_DELAY)
            itl_nominal += [gap - TOKEN_GAP for gap in r.itls]
            if seen is not None:
                ttft_server.append(r.ttft - seen["ttft"])
                itl_server += [c - s for c, s in zip(r.itls, seen["gaps"], strict=True)]
        failed = len(results) - len(done)
        rows = (
            ("TTFT - nominal", ttft_nominal),
            ("TTFT - server-seen", ttft_server),
            ("ITL - nominal", itl_nominal),
            ("ITL - server-seen", itl_server),
        )
        for index, (metric, values) in enumerate(rows):
            print(f"{label if index == 0 else '':<22}{metric:<22}{_ms(values)}")
        if failed:
            print(f"{'':<22}{failed} requests failed")


@dataclass
class Step:
    rate: float
    schedule_rate: float
    throughput: float
    send_rate: float | None
    lag_p50: float | None
    lag_p99: float | None
    lag_max: float | None
    failed: int
    client_cpu: float
    server_cpu: float
    other_cpu: float

    @property
    def sustained(self) -> bool:
        return (
            self.failed == 0
            and self.throughput >= 0.95 * self.schedule_rate
            and self.lag_p99 is not None
            and self.lag_p99 < 0.010
        )


def rate_step(base: str, rate: float, server_pid: int) -> Step:
    workload = Workload(
        num_requests=int(rate * STEP_SECONDS),
        rate=rate,
        prompt_tokens=32,
        output_tokens=2,
        timeout_s=15,
        seed=int(rate),
    )
    arrivals = arrival_times(workload)
    wall, cpu, server = time.perf_counter(), time.process_time(), _cpu_seconds(server_pid)
    busy = _cores_busy_seconds()
    results: list[RequestResult] = asyncio.run(run_workload(base + "/fast", "bench", workload))
    wall = time.perf_counter() - wall
    busy = _cores_busy_seconds() - busy
    cpu = time.process_time() - cpu
    server = _cpu_seconds(server_pid) - server
    summary = summarize(results)
    lag = summary.scheduling_lag
    return Step(
        rate=rate,
        schedule_rate=(len(arrivals) - 1) / arrivals[-1],
        throughput=summary.request_throughput,
        send_rate=summary.send_rate,
        lag_p50=lag.p50,
        lag_p99=lag.p99,
        lag_max=lag.max,
        failed=summary.failed,
        client_cpu=cpu / wall,
        server_cpu=server / wall,
        other_cpu=max(0.0, busy - cpu - server) / wall,
    )


def sustained_rate(base: str, server_pid: int, started: float) -> None:
    print(
        f"\n(2) Open-loop rate on one core, {STEP_SECONDS:.0f} s of Poisson arrivals per step; "
        "endpoint answers at once with 2 tokens."
    )
    header = (
        f"{'target':>7}{'sched':>8}{'done/s':>8}{'sent/s':>8}{'lag p50':>9}{'lag p99':>9}"
        f"{'lag max':>9}{'fail':>6}{'cli cpu':>9}{'srv cpu':>9}{'other':>7}  sustained"
    )
    print(header + "\n" + "(req/s)".rjust(7) + "(ms)".rjust(26))
    best = None
    for rate in RATE_STEPS:
        if time.perf_counter() - started > DEADLINE_SECONDS:
            print("(stopped: time budget spent)")
            break
        step = rate_step(base, rate, server_pid)

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.2f}"

        print(
            f"{step.rate:>7.0f}{step.schedule_rate:>8.0f}{step.throughput:>8.0f}"
            f"{step.send_rate or 0:>8.0f}{ms(step.lag_p50):>9}{ms(step.lag_p99):>9}"
            f"{ms(step.lag_max):>9}{step.failed:>6}{step.client_cpu:>9.0%}{step.server_cpu:>9.0%}"
            f"{step.other_cpu:>7.0%}"
            f"  {'yes' if step.sustained else 'NO'}"
        )
        if not step.sustained:
            break
        best = step.rate
    print(
        f"Highest sustained rate: {best or 'none'} req/s (steps {', '.join(map(str, RATE_STEPS))})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("Needs two cores (one for the endpoint, one for the generator).")
        return 1
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    server = context.Process(target=_serve, args=(sender,), daemon=True)
    server.start()
    try:
        port = receiver.recv()
        if server.pid is None:
            return 1
        os.sched_setaffinity(0, {CLIENT_CORE})
        base = f"http://127.0.0.1:{port}"
        time.sleep(0.5)  # the app finishes starting after it reported the port
        print(f"Endpoint pid {server.pid} on core {SERVER_CORE}; generator on core {CLIENT_CORE}.")
        timing_error(base)
        sustained_rate(base, server.pid, started)
    finally:
        server.terminate()
        server.join(5)
    print(f"\nTotal {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
