"""Benchmark: Capacity scaling in the test cluster, under live traffic, as a user runs it.

Real parts: upstream kube-apiserver, etcd and kube-controller-manager (its ReplicaSet,
endpoint-slice and garbage-collector controllers), the operator installed by `helm install` of
the chart (its pod a container of the operator image under podman and runc: the operator's own
process), the vLLM CPU engine, Prometheus scraping it. The test kubelet (tests/support) runs
the pods. Users send open-loop Poisson traffic to the Service's ready endpoints (as the
EndpointSlices list them: there is no kube-proxy here).

1. One replica's capacity (`--capacity`, or measured first: the capacity search of a study,
   on one engine of the configuration beside the control plane). Each engine computes on one
   thread of its own (`ONE_CORE`), as each GPU replica has its own GPU.
2. For each mode of `--modes`, an LLMDeployment with that capacity per replica
   (`capacityPerReplica`), one replica to start:
   - `Capacity`: slotune sizes the serving Deployment;
   - `External`: the README's HPA sizes it, through prometheus-adapter (built from its Go
     module) reading `slotune_llmdeployment_replicas_needed` from Prometheus, which scrapes
     the operator; the real kube-controller-manager's HPA controller writes the
     LLMDeployment's scale subresource, and slotune follows spec.replicas.
3. Users at `--surge` times that capacity for `--surge-seconds`, then `--quiet` times it.
4. Every second: the Deployment's replicas (asked, ready), SLOMet, the demand in status.

It prints and writes (bench/results/scaling-in-cluster.json), for each mode: when the count
went up and down, with the Events' figures; how long the live SLO was missed (SLOMet False)
during the surge; the users' attainment (share of requests within the TTFT bound) before the
second replica was ready and after; and how long after the drop the count came down, against
the stabilization window.

    PYTHONPATH=tests:operator:bench .venv/bin/python bench/scaling_in_cluster.py

The machine's cores are shared by every replica here (on a GPU node each replica has its own):
`bench/replicas_capacity.py` measures what a second replica adds on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# The engine (one request at a time, on a core of its own), the workload and the capacity
# search are replicas_capacity's.
from replicas_capacity import ONE_CORE, OUTPUT, PROMPT, SERIAL, one_replica
from replicas_capacity import config as engine_config

from slotune.local.process import LocalRuntime, cpu_dtype
from support.adapter import EXTERNAL_RULES, MetricsAdapter
from support.cluster import Cluster, OperatorPod, wait_for
from support.controlplane import ControlPlane, bin_dir_from_env
from support.engine import TINY_MODEL, vllm_python
from support.image import kubelet_image, operator_image
from support.kubelet import Kubelet, operator_commands
from support.prometheus import PrometheusServer, prometheus_binary
from support.users import Users

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "scaling"
OPERATOR_METRICS_PORT = 8080  # the chart's metrics.port
TTFT = 2.0
"""The SLO's TTFT p95 bound, seconds (`--ttft`)."""
HEADROOM = 0.1


def measure_one_replica(work: Path, ttft: float) -> float:
    """The capacity of one engine of SERIAL under the workload and SLO (a study's search)."""
    runtime = LocalRuntime(vllm_python(), work, dummy_weights=True)
    engine = runtime.start(engine_config(SERIAL, shared_cores=False), timeout=400)
    try:
        found = one_replica(engine.base_url, ttft)
    finally:
        engine.stop()
    print(f"one replica of {SERIAL}: capacity {found.describe()}", flush=True)
    return round(found.rate, 3)


def deployment(
    name: str,
    mode: str,
    capacity: float,
    *,
    window: int,
    stabilization: int,
    ttft: float,
    max_replicas: int,
) -> dict[str, Any]:
    return {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": str(TINY_MODEL), "servedName": name,
                      "source": {"randomWeights": {}}},
            "engine": {
                "image": "vllm/vllm-openai:v0.32.0",
                "attentionBackend": "CPU_ATTN",
                "args": {"maxModelLen": 4096, **SERIAL},
                "extraArgs": ["--skip-tokenizer-init", "--dtype", cpu_dtype()],
                "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
                        *({"name": k, "value": v} for k, v in ONE_CORE)],
            },
            "resources": {"gpus": 0},
            "slo": {"ttft": {"percentile": 95, "maxSeconds": ttft}, "window": f"{window}s"},
            "tuning": {"headroom": HEADROOM},
            "scaling": {
                "mode": mode, "minReplicas": 1, "maxReplicas": max_replicas,
                "stabilizationWindow": f"{stabilization}s", "capacityPerReplica": capacity,
            },
        },
    }  # fmt: skip


class Timeline:
    """Every second: (seconds since `start`, replicas asked, ready, SLOMet, demand)."""

    def __init__(self, cluster: Cluster, name: str, start: float) -> None:
        self.cluster, self.name, self.start = cluster, name, start
        self.rows: list[tuple[float, int, int, str, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            dep = self.cluster.get("deployment", self.name, NAMESPACE) or {}
            obj = self.cluster.get("llmd", self.name, NAMESPACE) or {}
            status = obj.get("status") or {}
            slo = next(
                (c["status"] for c in status.get("conditions", []) if c["type"] == "SLOMet"), "-"
            )
            self.rows.append((
                round(time.monotonic() - self.start, 1),
                (dep.get("spec") or {}).get("replicas", 0),
                (dep.get("status") or {}).get("readyReplicas", 0),
                slo,
                (status.get("scaling") or {}).get("demand"),
            ))  # fmt: skip
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def first(self, predicate: Any, after: float = 0.0) -> float | None:
        return next((r[0] for r in self.rows if r[0] >= after and predicate(r)), None)


def attainment(sent: list[Any], start: float, end: float, ttft: float) -> dict[str, Any]:
    kept = [s for s in sent if start <= s.at < end]
    within = sum(1 for s in kept if s.within(ttft))
    return {"from": round(start, 1), "to": round(end, 1), "requests": len(kept),
            "within": round(within / len(kept), 4) if kept else None}  # fmt: skip


def hpa(name: str, stabilization: int, max_replicas: int) -> dict[str, Any]:
    """The README's HPA: as many replicas as slotune says the demand needs, through
    prometheus-adapter's external metric; its scale-down window shortened like the spec's."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {"apiVersion": "slotune.dev/v1alpha1", "kind": "LLMDeployment",
                               "name": name},
            "minReplicas": 1,
            "maxReplicas": max_replicas,
            "metrics": [{"type": "External", "external": {
                "metric": {"name": "slotune_replicas_needed",
                           "selector": {"matchLabels": {"name": name}}},
                "target": {"type": "AverageValue", "averageValue": "1"}}}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": stabilization}},
        },
    }  # fmt: skip


def scenario(
    cluster: Cluster, name: str, mode: str, capacity: float, args: argparse.Namespace
) -> dict[str, Any]:
    """One LLMDeployment under one scaling mode through a surge and a quiet spell."""
    surge, quiet = args.surge * capacity, args.quiet * capacity
    # The SLO window holds 150 requests at the surge's rate (a p95 verdict needs 73).
    window = max(30, math.ceil(150 / surge))
    found: dict[str, Any] = {
        "mode": mode, "surge_rate": round(surge, 3), "quiet_rate": round(quiet, 3),
        "slo_window_s": window, "stabilization_s": args.stabilization,
        "max_replicas": args.max_replicas,
    }  # fmt: skip
    cluster.apply(
        deployment(
            name, mode, capacity, window=window, stabilization=args.stabilization,
            ttft=args.ttft, max_replicas=args.max_replicas,
        )
    )  # fmt: skip
    if mode == "External":
        cluster.apply(hpa(name, args.stabilization, args.max_replicas))
    wait_for(
        "one ready replica",
        lambda: ((cluster.get("deployment", name, NAMESPACE) or {}).get("status") or {}).get(
            "readyReplicas") == 1,
        400,
    )  # fmt: skip
    start = time.monotonic()
    timeline = Timeline(cluster, name, start)
    users = Users(
        cluster, NAMESPACE, name, [(surge, args.surge_seconds), (quiet, args.quiet_seconds)],
        prompt=PROMPT, output=OUTPUT, seed=21,
    )  # fmt: skip
    users.wait(timeout=args.surge_seconds + args.quiet_seconds + 900)
    time.sleep(5)
    timeline.stop()
    fields = "{.involvedObject.name}{'\\t'}{.reason}{'\\t'}{.message}{'\\n'}"
    events = cluster.kubectl(
        "get", "events", "-n", NAMESPACE, "-o", f"jsonpath={{range .items[*]}}{fields}{{end}}"
    ).stdout
    print(cluster.kubectl("get", "llmd,hpa", "-n", NAMESPACE).stdout)
    cluster.kubectl("delete", "llmd,hpa", "--all", "-n", NAMESPACE)
    drop = args.surge_seconds
    out_at = timeline.first(lambda r: r[1] >= 2)
    ready_at = timeline.first(lambda r: r[2] >= 2)
    met_at = timeline.first(lambda r: r[3] == "True", after=ready_at or 0)
    missed_at = timeline.first(lambda r: r[3] == "False")
    in_at = timeline.first(lambda r: r[1] <= 1, after=drop)
    sent = users.results
    found.update({
        "scaled_out_at_s": out_at, "second_replica_ready_at_s": ready_at,
        "slo_missed_from_s": missed_at, "slo_met_again_at_s": met_at,
        "slo_missed_for_s": round(met_at - missed_at, 1) if met_at and missed_at else None,
        "scaled_in_at_s": in_at,
        "scaled_in_after_drop_s": round(in_at - drop, 1) if in_at is not None else None,
        "before": attainment(sent, 0, ready_at or drop, args.ttft),
        # None when the second replica was ready only after the surge ended.
        "after": attainment(sent, ready_at + window, drop, args.ttft)
        if ready_at is not None and ready_at + window < drop
        else None,
        "quiet": attainment(sent, drop, drop + args.quiet_seconds, args.ttft),
        "most_replicas": max((r[1] for r in timeline.rows), default=0),
        "events": [line for line in events.splitlines()
                   if (line.startswith(f"{name}\t") and "\tScal" in line)
                   or "SuccessfulRescale" in line],
        "timeline": timeline.rows,
    })  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=float, help="one replica's (default: measured)")
    parser.add_argument("--modes", default="Capacity,External")
    parser.add_argument("--surge", type=float, default=1.8)
    parser.add_argument("--quiet", type=float, default=0.3)
    parser.add_argument("--surge-seconds", type=float, default=240)
    parser.add_argument("--quiet-seconds", type=float, default=180)
    parser.add_argument("--stabilization", type=int, default=45)
    parser.add_argument("--max-replicas", type=int, default=3, help="one per engine the node fits")
    parser.add_argument("--ttft", type=float, default=TTFT, help="the SLO's TTFT p95 bound, s")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/scaling-in-cluster.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="scaling-in-cluster-"))
    bin_dir = bin_dir_from_env()
    found: dict[str, Any] = {"config": SERIAL, "env": dict(ONE_CORE), "prompt": PROMPT,
                             "output": OUTPUT, "ttft_p95": args.ttft, "headroom": HEADROOM,
                             "scenarios": []}  # fmt: skip
    with ControlPlane(bin_dir, work / "plane") as plane:
        cluster = Cluster(plane, bin_dir)
        cluster.install_crd()
        node = Kubelet(
            cluster.kubeconfig, work / "kubelet", operator_commands(vllm_python()),
            images=[kubelet_image()],
        )  # fmt: skip
        with (
            node,
            # The engines through the kubelet's file, the operator's own metrics (its pod's
            # container shares the host's network) for the adapter.
            PrometheusServer(
                prometheus_binary(install=True), work / "prometheus",
                targets=[f"127.0.0.1:{OPERATOR_METRICS_PORT}"], file_sd=node.file_sd, job="pods",
            ) as prometheus,
            MetricsAdapter(cluster, work / "adapter", prometheus.url, EXTERNAL_RULES),
        ):  # fmt: skip
            capacity = args.capacity or measure_one_replica(work / "calibration", args.ttft)
            found["capacity_per_replica"] = capacity
            cluster.kubectl("create", "namespace", NAMESPACE)
            repository, tag = operator_image().removeprefix("docker.io/").rsplit(":", 1)
            operator = OperatorPod(
                cluster, node, work, release="slotune", namespace="slotune-system",
                values={"image": {"repository": repository, "tag": tag},
                        "prometheusURL": prometheus.url,
                        "extraEnv": [{"name": "SLOTUNE_RESYNC_SECONDS", "value": "3"}]},
            )  # fmt: skip
            operator.install()
            for mode in args.modes.split(","):
                name = f"chat-{mode.lower()}"
                result = scenario(cluster, name, mode, capacity, args)
                found["scenarios"].append(result)
                args.out.write_text(json.dumps(found, indent=1) + "\n")
                for key, value in result.items():
                    if key != "timeline":
                        print(f"{mode} {key}: {value}", flush=True)
            operator.uninstall()
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
