"""Benchmark: trial pods' start to Ready in the test cluster, with a cache claim shared by every
trial pod (`spec.cache`) and without one (each pod's own emptyDir), on the real vLLM CPU engine.

The test control plane and its kubelet (tests/support/kubelet.py) run each trial pod as slotune
renders it (`render.render_trial_pod`), one at a time: created, timed until its Ready condition
is True (the kubelet's readiness probe on the engine's /health), deleted. Each cycle runs both
arms (their order alternating between cycles), each arm a sequence of trials: vLLM's defaults,
then max-num-seqs changed, then max-num-batched-tokens changed, then vLLM's defaults again. The
claim arm mounts a new claim each cycle, so its first trial starts from an empty cache.

The kubelet runs an engine as a local process, not in a container, so a cache the engine
places by `HOME` or under `/tmp` (Inductor's default) would be the machine's, shared by every
pod of both arms. Both arms therefore point `HOME` and the engine's cache variables
(`Engine.cache_dirs`) under the cache mount, as a container's own filesystem would hold them:
the arms differ only in the volume behind it.

    PYTHONPATH=operator:tests .venv/bin/python bench/cache_in_cluster.py --cycles 3
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slotune import models, render
from slotune.local.process import cpu_dtype
from support.cluster import Cluster, wait_for
from support.controlplane import ControlPlane, bin_dir_from_env
from support.engine import TINY_MODEL, vllm_python
from support.kubelet import Kubelet, operator_commands

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "caches"
TRIALS: list[tuple[str, dict[str, Any]]] = [
    ("first", {}),
    ("seqs", {"max_num_seqs": 64}),
    ("batched", {"max_num_batched_tokens": 1024}),
    ("again", {}),
]


def spec(claim: str | None) -> models.LLMDeploymentSpec:
    body: dict[str, Any] = {
        "model": {"name": str(TINY_MODEL), "servedName": "tiny", "source": {"randomWeights": {}}},
        "engine": {
            "image": "vllm/vllm-openai:v0.32.0",
            "attentionBackend": "CPU_ATTN",
            "args": {"maxModelLen": 4096, "maxNumBatchedTokens": 2048, "maxNumSeqs": 128},
            "extraArgs": ["--skip-tokenizer-init", "--dtype", cpu_dtype()],
            "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],
        },
        "resources": {"gpus": 0},
        "slo": {"ttft": {"percentile": 95, "maxSeconds": 2}},
    }
    if claim is not None:
        body["cache"] = {"pvc": {"claimName": claim}}
    return models.LLMDeploymentSpec.model_validate(body)


def with_local_caches(pod: dict[str, Any], spec: models.LLMDeploymentSpec) -> dict[str, Any]:
    """The pod with HOME and every engine cache under the cache mount (see the docstring)."""
    container = pod["spec"]["containers"][0]
    env = [e for e in container.get("env", []) if e["name"] != "HOME"]
    names = {e["name"] for e in env}
    env.append({"name": "HOME", "value": f"{render.CACHE_MOUNT}/home"})
    for name, folder in render.engine_of(spec).cache_dirs.items():
        if name not in names:
            env.append({"name": name, "value": f"{render.CACHE_MOUNT}/{folder}"})
    container["env"] = env
    return pod


def ready_seconds(cluster: Cluster, pod: dict[str, Any]) -> float:
    """Creates the pod, times it to Ready, deletes it and waits until it is gone."""
    name = pod["metadata"]["name"]
    began = time.monotonic()
    created = cluster.apply(pod)
    if created.returncode != 0:
        raise SystemExit(f"creating {name} failed: {created.stderr}")

    def ready() -> bool:
        found = cluster.get("pod", name, NAMESPACE) or {}
        status = found.get("status") or {}
        if status.get("phase") in {"Failed", "Succeeded"}:
            raise AssertionError(f"{name} ended: {status}")
        conditions = status.get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(f"{name} to be Ready", ready, timeout=600, interval=0.25)
    seconds = time.monotonic() - began
    cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true", "--timeout=120s")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/cache-in-cluster.json")
    args = parser.parse_args(argv)
    # A SIGTERM unwinds through the `with`s: the control plane and the engines stop too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="cache-in-cluster-"))
    bin_dir = bin_dir_from_env()
    rows: list[dict[str, Any]] = []
    with ControlPlane(bin_dir, work / "plane") as plane:
        cluster = Cluster(plane, bin_dir)
        cluster.install_crd()
        with Kubelet(cluster.kubeconfig, work / "kubelet", operator_commands(vllm_python())):
            cluster.kubectl("create", "namespace", NAMESPACE)
            # The trial pods' owner: without it the garbage collector would delete them.
            body = {"apiVersion": models.API_VERSION, "kind": models.KIND,
                    "metadata": {"name": "chat", "namespace": NAMESPACE},
                    "spec": spec(None).model_dump(mode="json", by_alias=True,
                                                  exclude_defaults=True)}  # fmt: skip
            applied = cluster.apply(body)
            if applied.returncode != 0:
                raise SystemExit(f"creating the LLMDeployment failed: {applied.stderr}")
            uid = (cluster.get("llmd", "chat", NAMESPACE) or {})["metadata"]["uid"]
            owner = render.Owner("chat", NAMESPACE, uid)
            for cycle in range(args.cycles):
                arms = ["emptyDir", "claim"] if cycle % 2 == 0 else ["claim", "emptyDir"]
                for arm in arms:
                    arm_spec = spec(f"cache-{cycle}" if arm == "claim" else None)
                    for number, (label, params) in enumerate(TRIALS, start=1):
                        study = 100 * cycle + (1 if arm == "claim" else 2)
                        pod = render.render_trial_pod(owner, arm_spec, params, study, number)
                        seconds = ready_seconds(cluster, with_local_caches(pod, arm_spec))
                        rows.append({"cycle": cycle, "arm": arm, "trial": label,
                                     "params": params, "seconds": round(seconds, 2)})  # fmt: skip
                        print(f"cycle {cycle} {arm:8} {label:8} {seconds:6.1f} s", flush=True)
                        args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    summary = {}
    for arm in ("emptyDir", "claim"):
        for label, _ in TRIALS:
            values = [r["seconds"] for r in rows if r["arm"] == arm and r["trial"] == label]
            summary[f"{arm}/{label}"] = {"median": statistics.median(values), "all": values}
            print(f"{arm:8} {label:8} median {statistics.median(values):6.1f} s  {values}")
    # Paired by cycle: a claim trial over the emptyDir trial of the same kind and cycle.
    for label, _ in TRIALS:
        ratios = [
            next(r["seconds"] for r in rows if r["cycle"] == c and r["arm"] == "claim"
                 and r["trial"] == label)
            / next(r["seconds"] for r in rows if r["cycle"] == c and r["arm"] == "emptyDir"
                   and r["trial"] == label)
            for c in range(args.cycles)
        ]  # fmt: skip
        summary[f"claim/emptyDir {label}"] = {"ratios": ratios}
        print(f"claim / emptyDir, {label:8}: {', '.join(f'{x:.2f}' for x in ratios)}")
    args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
