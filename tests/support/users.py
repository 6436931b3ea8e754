"""Users of a model's Service: open-loop Poisson traffic in phases, each request sent to one of
the Service's endpoints (the one with the fewest requests in flight, as a load balancer does):
the ready pods its selector picks, as the endpoint controllers would list them. The test
cluster has no kube-proxy, so the Service's virtual IP routes nowhere, and its pods' loopback
addresses are no valid Endpoints (the API server refuses 127.0.0.0/8): the users pick the
endpoints themselves.

    users = Users(cluster, namespace, "chat", [(6.0, 120), (1.0, 90)], prompt=64, output=8)
    ...                      # runs in the background
    users.wait()
    users.results            # every request: when it was scheduled, to which pod, its TTFT
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from slotune.measure import loadgen
from support.cluster import Cluster


@dataclass(frozen=True)
class Sent:
    """One user request: scheduled `at` seconds after the start, to `endpoint`."""

    at: float
    endpoint: str
    result: loadgen.RequestResult

    def within(self, ttft_bound: float) -> bool:
        return self.result.error is None and (self.result.ttft or float("inf")) <= ttft_bound


class Users:
    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        service: str,
        phases: list[tuple[float, float]],
        *,
        prompt: int,
        output: int,
        seed: int = 0,
        port: int = 8000,
    ) -> None:
        self.cluster, self.namespace, self.service = cluster, namespace, service
        self.phases, self.prompt, self.output, self.seed = phases, prompt, output, seed
        self.port = port
        self.results: list[Sent] = []
        self.endpoints: list[str] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch_endpoints, daemon=True)
        self._watcher.start()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    def wait(self, timeout: float = 900) -> None:
        self._thread.join(timeout=timeout)
        self._stop.set()

    def _ready_endpoints(self) -> list[str]:
        service = self.cluster.get("service", self.service, self.namespace) or {}
        selector = (service.get("spec") or {}).get("selector") or {}
        if not selector:
            return []
        answer = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-o", "json",
            "-l", ",".join(f"{k}={v}" for k, v in sorted(selector.items())), check=False,
        )  # fmt: skip
        found = []
        for pod in json.loads(answer.stdout or '{"items": []}')["items"]:
            status = pod.get("status") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            if ready and status.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
                found.append(status["podIP"])
        return sorted(found)

    def _watch_endpoints(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a failed read keeps the last list
                self.endpoints = self._ready_endpoints()
            self._stop.wait(1.0)

    async def _run(self) -> None:
        clock = time.perf_counter
        start = clock()
        flights: dict[str, dict[int, Any]] = {}
        senders: dict[str, Any] = {}
        tasks: list[asyncio.Task[None]] = []
        offset, index = 0.0, 0
        async with contextlib.AsyncExitStack() as stack:
            for number, (rate, seconds) in enumerate(self.phases):
                workload = loadgen.Workload(
                    num_requests=max(1, round(rate * seconds)), seed=self.seed + number,
                    rate=rate, prompt_tokens=self.prompt, prompt_spread=0.1,
                    output_tokens=self.output, warmup_requests=0, timeout_s=600,
                )  # fmt: skip
                plans = loadgen.plan_requests(workload)
                arrivals = loadgen.arrival_times(workload, len(plans))
                for plan, arrival in zip(plans, arrivals, strict=True):
                    at = offset + arrival
                    delay = start + at - clock()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    ready = list(self.endpoints)
                    while not ready:  # no endpoint: the request waits, as a client retries
                        await asyncio.sleep(0.2)
                        ready = list(self.endpoints)
                    target = min(ready, key=lambda ip: len(flights.get(ip, {})))
                    if target not in senders:
                        flights[target] = {}
                        senders[target] = await stack.enter_async_context(
                            loadgen.sender(
                                f"http://{target}:{self.port}", self.service, timeout_s=600,
                                clock=clock, in_flight=flights[target],
                            )
                        )  # fmt: skip
                    numbered = replace(plan, index=index)  # unique across the phases
                    index += 1
                    tasks.append(
                        asyncio.create_task(
                            self._send(senders[target], numbered, start, at, target)
                        )
                    )
                offset += seconds
            await asyncio.gather(*tasks)

    async def _send(self, send: Any, plan: Any, start: float, at: float, target: str) -> None:
        result = await send(plan, start, at)
        self.results.append(Sent(at=at, endpoint=target, result=result))
