"""Benchmark: what a second replica adds on this machine, on the real vLLM CPU engine.

Capacity scaling divides the demand by one replica's capacity; that holds only where replicas
add up. On a GPU each replica has its own. On this machine two engines share the CPU cores, so
whether two replicas carry twice one replica's capacity depends on the configuration: one that
serves one request at a time (`max-num-seqs 1`) leaves cores idle between its steps, one that
batches fills them.

1. One engine of the configuration: its capacity under the workload and SLO (the capacity
   search a study runs, `CapacityMeasure`, precise).
2. At rates of `--multiples` of that capacity, the same Poisson arrivals (one seed per rate)
   sent to one replica, then split between two (each request to the replica with fewer in
   flight, as a load balancer would): TTFT p95 and the share of requests within the SLO, for
   each. The rates are interleaved, one replica then two, each after a pause.

    PYTHONPATH=operator .venv/bin/python bench/replicas_capacity.py

Writes bench/results/replicas-capacity.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner_comparison import MODEL, ROOT, vllm_python

from slotune.local.process import LocalRuntime, cpu_dtype
from slotune.measure import loadgen
from slotune.measure.capacity import Capacity, MeasureRequest
from slotune.measure.probe import CapacityMeasure, measure_ceiling
from slotune.models import EngineArgs, LLMDeploymentSpec
from slotune.runtime import EngineConfig
from slotune.stats import percentile

SERIAL = {"maxNumBatchedTokens": 2048, "maxNumSeqs": 1, "blockSize": 128}
ONE_CORE = (
    ("OMP_NUM_THREADS", "1"),
    ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
)
"""Each engine computes on one thread, bound to no core, in one process: two engines get a core
each, as two GPU replicas get a GPU each. vLLM's CPU default binds every engine's threads to
the same cores (`--shared-cores` measures that), and runs the model in a worker process apart
from the engine core, each of them spinning (`sched_yield`) on their shared-memory queue for a
second after every step: under load each engine then keeps two cores busy, and on this
machine a second replica added nothing (bench/results/scaling-in-cluster.md).
`VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the model in the engine core's process."""
PROMPT, OUTPUT = 512, 32
SLO_TTFT = 2.0
"""The SLO's TTFT p95 bound, seconds (`--ttft`)."""


def spec(rate: float, ttft: float) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "tiny"},
            "slo": {"ttft": {"percentile": 95, "maxSeconds": ttft}},
            "tuning": {
                "workload": {
                    "source": "Synthetic",
                    "promptTokens": {"mean": PROMPT, "spread": 0.1},
                    "outputTokens": {"mean": OUTPUT},
                    "requestRate": rate,
                    "duration": "10s",
                }
            },
        }
    )


def config(params: dict[str, Any], *, shared_cores: bool) -> EngineConfig:
    return EngineConfig(
        model=str(MODEL),
        served_name="tiny",
        args=EngineArgs.model_validate({"maxModelLen": 4096, **params}),
        extra_args=("--skip-tokenizer-init", "--dtype", cpu_dtype()),
        env=(("VLLM_CPU_KVCACHE_SPACE", "1"), *(() if shared_cores else ONE_CORE)),
    )


def one_replica(base_url: str, ttft: float) -> Capacity:
    """The capacity of the engine at `base_url` under the workload and an SLO of TTFT p95 <=
    `ttft`: the precise search a study runs, from the engine's prefill ceiling."""
    workload = spec(1.0, ttft)
    measure = CapacityMeasure(workload, "tiny", log=lambda line: print("  " + line))
    ceiling = asyncio.run(measure_ceiling(base_url, "tiny", workload.tuning.workload))
    request = MeasureRequest(
        seed=7, target_rate=ceiling.prefill_rate / 5, ceiling=ceiling, precise=True
    )
    found = measure(base_url, request).capacity
    if found is None or found.rate <= 0:
        raise SystemExit("the capacity search measured nothing")
    return found


async def split(urls: list[str], rate: float, seconds: float, seed: int) -> list[Any]:
    """Poisson arrivals at `rate` for `seconds`, each sent to the URL with fewest in flight."""
    workload = loadgen.Workload(
        num_requests=round(rate * seconds), seed=seed, rate=rate, prompt_tokens=PROMPT,
        prompt_spread=0.1, output_tokens=OUTPUT, warmup_requests=0,
    )  # fmt: skip
    plans = loadgen.plan_requests(workload)
    arrivals = loadgen.arrival_times(workload, len(plans))
    clock = time.perf_counter
    flights: list[dict[int, Any]] = [{} for _ in urls]
    async with contextlib_stack(urls, flights, clock) as senders:
        start = clock()
        tasks = []
        for plan, arrival in zip(plans, arrivals, strict=True):
            delay = start + arrival - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            index = min(range(len(urls)), key=lambda i: len(flights[i]))
            tasks.append(asyncio.create_task(senders[index](plan, start, arrival)))
        return list(await asyncio.gather(*tasks))


class contextlib_stack:  # noqa: N801 - used as a context manager, like contextlib's
    """One `loadgen.sender` per URL, entered together."""

    def __init__(self, urls: list[str], flights: list[dict[int, Any]], clock: Any) -> None:
        self.managers = [
            loadgen.sender(u, "tiny", timeout_s=300, clock=clock, in_flight=f)
            for u, f in zip(urls, flights, strict=True)
        ]

    async def __aenter__(self) -> list[Any]:
        return [await m.__aenter__() for m in self.managers]

    async def __aexit__(self, *exc: Any) -> None:
        for m in reversed(self.managers):
            await m.__aexit__(*exc)


def judged(results: list[Any], skip_s: float, ttft: float) -> dict[str, Any]:
    """TTFT p95 and the share within the SLO, after the first `skip_s` seconds (warm-up)."""
    kept = [r for r in results if r.scheduled_at >= skip_s]
    ttfts = [r.ttft if r.ttft is not None and r.error is None else float("inf") for r in kept]
    within = sum(1 for t in ttfts if t <= ttft)
    return {
        "requests": len(kept),
        "ttft_p95": percentile(ttfts, 95) if ttfts else None,
        "within": within / len(kept) if kept else None,
        "errors": sum(1 for r in kept if r.error),
        "error_kinds": sorted({r.error[:80] for r in kept if r.error})[:3],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multiples", default="1.4,1.8")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ttft", type=float, default=SLO_TTFT, help="the SLO's TTFT p95 bound, s")
    parser.add_argument("--shared-cores", action="store_true", help="vLLM's default binding")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/replicas-capacity.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="replicas-capacity-"))
    runtime = LocalRuntime(vllm_python(), work, dummy_weights=True)
    found: dict[str, Any] = {"config": SERIAL, "prompt": PROMPT, "output": OUTPUT,
                             "slo_ttft_p95": args.ttft, "shared_cores": args.shared_cores,
                             "rates": []}  # fmt: skip
    first = runtime.start(config(SERIAL, shared_cores=args.shared_cores), timeout=300)
    second = None
    try:
        one = one_replica(first.base_url, args.ttft)
        print(f"one replica: capacity {one.describe()}", flush=True)
        found["one_replica"] = {"rate": one.rate, "low": one.low, "high": one.high}
        second = runtime.start(config(SERIAL, shared_cores=args.shared_cores), timeout=300)
        for n, multiple in enumerate(float(m) for m in args.multiples.split(",")):
            rate = round(multiple * one.rate, 3)
            row: dict[str, Any] = {"multiple": multiple, "rate": rate}
            for name, urls in (
                ("one", [first.base_url]),
                ("two", [first.base_url, second.base_url]),
            ):
                time.sleep(10)  # the queue of the previous run drains
                results = asyncio.run(split(urls, rate, args.seconds, seed=100 + n))
                row[name] = judged(results, skip_s=10.0, ttft=args.ttft)
                print(f"  {multiple:g}x ({rate} req/s) on {name}: {row[name]}", flush=True)
            found["rates"].append(row)
            args.out.write_text(json.dumps(found, indent=2) + "\n")
    finally:
        first.stop()
        if second is not None:
            second.stop()
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
