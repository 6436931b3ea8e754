"""The whole loop in a cluster: the operator tunes an LLMDeployment whose pods run the real vLLM
CPU engine, measured by its load Jobs and watched through the real Prometheus.

Real parts: upstream kube-apiserver, etcd and kube-controller-manager (its ReplicaSet, Job and
garbage-collector controllers), the operator installed by `helm install` of the chart (its pod
a container of the operator image under podman and runc, with the release's ServiceAccount
token and RBAC), the load Jobs as containers of the same image, the vLLM CPU engine, the load
generator, Prometheus. The test kubelet (support.kubelet) is the node this environment lacks:
it runs the image's pods as real containers, and the vLLM pods (there is no vLLM image here) as
local processes of their own command and arguments, and reports the pods' status through the
API. Prometheus discovers the pods from the file the kubelet writes, as kubernetes_sd would
from the API.

The workload is a chat of 512-token prompts and 32 output tokens, with TTFT p95 <= 2 s, at a
rate set from this machine's speed: the capacity of vLLM's CPU defaults (128 sequences, 2048
batched tokens) under this very workload and SLO, measured before the tests on a real engine
beside the control plane (a study's own measurement, `CapacityMeasure`). The study must carry
the users' rate with 10% headroom, and the rate is set so that this target is DEFAULTS_MARGIN of
the defaults' measured capacity. (The README example's 2048-token prompts are too slow a unit on
a CPU without native bf16: an AMD Zen 3 prefilled 1.1 of them a second in float32, which puts a
73-request probe window at two and a half minutes; 512-token prompts went at 10.6 a second.)

Earlier the rate was a fixed fraction (0.4) of the defaults' prefill ceiling, calibrated with
2048-token prompts, where the defaults passed at 0.59-0.64 of the ceiling. With these 512-token
prompts something other than prefill binds first, and how much earlier depends on the machine:
on a fast instance the defaults carried 0.39 of the ceiling (24.4 req/s against a 27.4 target),
so the study's verdict on them sat at the target's edge, a coin toss between "feasible" and
not, and the test failed when it fell the wrong way. Measuring the defaults' capacity itself
takes the edge away on any machine: the target sits DEFAULTS_MARGIN below what the defaults
carry, far beyond the spread between engine starts (`Platform.spread`) and the fit's interval.

The deployment starts on a configuration that serves one request at a time (`maxNumSeqs: 1`),
which carries a sixth or less of what the defaults carry (3.4-4.3 against 24.4 req/s on the
fast instance; a request holds the whole engine), so its queue grows without bound at the
users' rate. So the live SLO misses before tuning and holds after it, and a trial's verdict on
either is away from its boundary on a slow machine as on a fast one.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from slotune.local.process import LocalRuntime, cpu_dtype
from slotune.measure import loadgen
from slotune.measure.capacity import MeasureRequest
from slotune.measure.probe import CapacityMeasure, default_search, measure_ceiling
from slotune.models import EngineArgs, LLMDeploymentSpec
from slotune.render import LOAD_CONTAINER
from slotune.runtime import EngineConfig
from slotune.tuner.records import loads
from support.cluster import RESYNC_SECONDS, Cluster, OperatorPod, OperatorProcess, wait_for
from support.engine import TINY_MODEL, vllm_python
from support.image import kubelet_image, operator_image
from support.kubelet import Kubelet, Pod, operator_commands
from support.prometheus import PrometheusServer, prometheus_binary

pytestmark = [pytest.mark.integration, pytest.mark.engine]

NAMESPACE = "tuning"
ENGINE_START = 400.0  # a vLLM CPU start takes 45-115 s alone, longer beside a measurement
TRIAL = 900.0
"""One trial at RATE_OF_TRIAL requests/s or more: its records' seconds were 475-677 there. A
trial's probes last a number of requests and of request lifetimes, so on a slower machine
(a lower rate) it takes longer: `trial_seconds`."""
RATE_OF_TRIAL = 4.0
DEFAULTS_MARGIN = 0.6
"""The study's target (the users' rate with headroom) as a fraction of the capacity of vLLM's
defaults measured before the test: 0.51 below it in ln rate, six standard deviations of a CPU
start's fitted capacity (0.082 in ln rate, `bench/results/capacity-repeatability-seed300.json`,
where five starts spread by 0.045), so the defaults' interval in the study lies above the
target on any machine, while the one-at-a-time configuration carries a sixth of it."""
SLO = {"ttft": {"percentile": 95, "maxSeconds": 2.0}}
HEADROOM = 0.1
"""The spec's default headroom, which the study's target adds to the users' rate."""
LIVE_REQUESTS = 150
"""Requests the SLO window holds at the users' rate: twice the 73 that a p95 met with every
request within the bound needs (Wilson's lower end of 73/73 is 95%), so a window that is 99%
within the bound is judged met. A fixed 30 s left the window at most 74 requests on CI's slow
machine (the defaults carried 2.71 requests/s, so the rate was at most 2.46), where one slow
request keeps the SLO from being met, and SLOMet=True never came."""
PROMPT_TOKENS = 512
OUTPUT_TOKENS = 32
SHAPE = {
    "source": "Synthetic",
    "promptTokens": {"mean": PROMPT_TOKENS, "spread": 0.1},
    "outputTokens": {"mean": OUTPUT_TOKENS},
    "duration": "10s",
}
SERVING = {"maxNumBatchedTokens": 2048, "maxNumSeqs": 1, "blockSize": 128}
"""The deployment's own configuration: one request at a time."""
DEFAULTS = {"maxNumBatchedTokens": 2048, "maxNumSeqs": 128, "blockSize": 128}
"""vLLM's CPU defaults, as a study's first trial runs them."""


def live_window(rate: float) -> int:
    """The SLO window (s) at the users' rate: LIVE_REQUESTS requests, 30 s at least."""
    return max(30, math.ceil(LIVE_REQUESTS / rate))


def trial_seconds(workload: dict[str, Any]) -> float:
    """How long one trial may take at the workload's rate (TRIAL, scaled for a slower machine)."""
    return TRIAL * max(1.0, RATE_OF_TRIAL / workload["requestRate"])


def tiny(name: str, *, tuning: dict[str, Any], replicas: int = 1, **spec: Any) -> dict[str, Any]:
    """An LLMDeployment of the tiny Llama-shaped model on the CPU engine, its SLO window
    fitted to the rate of the tuning workload."""
    window = live_window(tuning["workload"]["requestRate"])
    return {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {
                "name": str(TINY_MODEL),
                "servedName": name,
                "source": {"randomWeights": {}},
            },
            "engine": {
                "image": "vllm/vllm-openai:v0.32.0",
                "attentionBackend": "CPU_ATTN",
                "args": {"maxModelLen": 4096, **SERVING},
                "extraArgs": ["--skip-tokenizer-init", "--dtype", cpu_dtype()],
                "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],
            },
            "resources": {"gpus": 0},
            "replicas": replicas,
            "slo": {**SLO, "window": f"{window}s"},
            "tuning": tuning,
            **spec,
        },
    }


def space(*batched: int, seqs: tuple[int, ...] = (128, 1)) -> dict[str, Any]:
    return {
        "maxNumBatchedTokens": {"values": list(batched)},
        "maxNumSeqs": {"values": list(seqs)},
        "blockSize": {"values": [128]},
        "enablePrefixCaching": [True],
        "kvCacheDtype": ["auto"],
    }


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workload(kubelet: Kubelet, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The spec's workload, at a rate whose target is DEFAULTS_MARGIN of the capacity of vLLM's
    defaults as this machine runs them now, under this workload and SLO (the measurement a
    study makes on its first trial, ceiling and all), with the control plane and the kubelet
    running beside it."""
    runtime = LocalRuntime(
        vllm_python(), tmp_path_factory.mktemp("calibration"), dummy_weights=True
    )
    config = EngineConfig(
        model=str(TINY_MODEL),
        served_name="calibration",
        args=EngineArgs.model_validate({"maxModelLen": 4096, **DEFAULTS}),
        extra_args=("--skip-tokenizer-init",),
        env=(("VLLM_CPU_KVCACHE_SPACE", "1"),),
    )
    spec = LLMDeploymentSpec.model_validate(
        {
            "model": {"name": "calibration"},
            "slo": SLO,
            "tuning": {"workload": {**SHAPE, "requestRate": 1.0}},
        }
    )
    engine = runtime.start(config, timeout=ENGINE_START)
    try:
        # Four probes: the margin below needs the capacity to within a few tens of percent.
        measure = CapacityMeasure(
            spec,
            "calibration",
            search=lambda target, ceiling: replace(default_search(target, ceiling), max_probes=4),
            log=lambda line: print("  " + line),
        )
        # The search starts from a guess (a fifth of the prefill ceiling, measured first) and
        # brackets the defaults' capacity from there.
        ceiling = asyncio.run(measure_ceiling(engine.base_url, "calibration", spec.tuning.workload))
        request = MeasureRequest(
            seed=7, target_rate=ceiling.prefill_rate / 5, ceiling=ceiling, precise=True
        )
        found = measure(engine.base_url, request).capacity
    finally:
        engine.stop()
    assert found is not None, "the calibration measured no capacity"
    assert found.rate > 0, found
    rate = round(DEFAULTS_MARGIN * found.rate / (1 + HEADROOM), 2)
    print(f"vLLM's defaults here: capacity {found.describe()} under this workload and SLO "
          f"(prefill ceiling {ceiling.prefill_rate:.2f} requests/s); the users' rate: {rate} "
          f"requests/s, the study's target {rate * (1 + HEADROOM):.2f}")  # fmt: skip
    return {**SHAPE, "requestRate": rate}


@pytest.fixture(scope="module")
def kubelet(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubelet]:
    node = Kubelet(
        cluster.kubeconfig,
        tmp_path_factory.mktemp("kubelet"),
        operator_commands(vllm_python()),
        images=[kubelet_image()],  # the load Jobs run the operator image as real containers
    )
    with node:
        cluster.kubectl("create", "namespace", NAMESPACE)
        yield node
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.fixture(scope="module")
def prometheus(kubelet: Kubelet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server = PrometheusServer(
        prometheus_binary(install=True),
        tmp_path_factory.mktemp("prometheus"),
        file_sd=kubelet.file_sd,
        job="pods",
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def tuning_operator(
    cluster: Cluster,
    kubelet: Kubelet,
    prometheus: PrometheusServer,
    operator: OperatorProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorPod]:
    """The operator as a user installs it: `helm install` of the chart, its pod a container of
    the operator image. The session's cluster-wide operator (a process, without Prometheus) is
    stopped meanwhile, or both would reconcile these LLMDeployments."""
    operator.stop()
    repository, tag = operator_image().removeprefix("docker.io/").rsplit(":", 1)
    pod = OperatorPod(
        cluster,
        kubelet,
        tmp_path_factory.mktemp("helm"),
        release="slotune-tuning",
        namespace="slotune-tuning",
        values={
            "image": {"repository": repository, "tag": tag},
            "prometheusURL": prometheus.url,
            "tuning": {"trialStartupSeconds": int(ENGINE_START)},
            "extraEnv": [{"name": "SLOTUNE_RESYNC_SECONDS", "value": str(RESYNC_SECONDS)}],
        },
    )
    pod.install()
    yield pod
    pod.uninstall()
    operator.start()


# --- helpers ---------------------------------------------------------------------------------


def llmd(cluster: Cluster, name: str) -> dict[str, Any]:
    obj = cluster.get("llmd", name, NAMESPACE)
    assert obj is not None
    return obj


def tuning_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return (llmd(cluster, name).get("status") or {}).get("tuning") or {}


def slo_judged(obj: dict[str, Any], met: str, requests: int = 20) -> bool:
    """SLOMet is `met`, judged from at least `requests` requests in the window."""
    targets = ((obj.get("status") or {}).get("slo") or {}).get("targets") or []
    ttft = next((t for t in targets if t["name"] == "ttft"), {})
    return condition(obj, "SLOMet").get("status") == met and ttft.get("requests", 0) >= requests


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_]
    return found[0] if found else {}


def template_hash(cluster: Cluster, name: str) -> str:
    deployment = cluster.get("deployment", name, NAMESPACE)
    assert deployment is not None
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels["slotune.dev/config-hash"]


def serving_pod(cluster: Cluster, kubelet: Kubelet, name: str) -> tuple[str, str] | None:
    """(pod name, IP) of a ready serving pod of the LLMDeployment, if there is one."""
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-n", NAMESPACE, "-o", "json",
            "-l", f"app.kubernetes.io/instance={name},app.kubernetes.io/component=serving",
        ).stdout
    )["items"]  # fmt: skip
    for pod in pods:
        ready = [c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"]
        if ready and ready[0]["status"] == "True" and not pod["metadata"].get("deletionTimestamp"):
            return pod["metadata"]["name"], pod["status"]["podIP"]
    return None


def trial_objects(cluster: Cluster, name: str) -> list[str]:
    found = []
    for kind, component in (("pods", "trial"), ("jobs", "load")):
        out = cluster.kubectl(
            "get", kind, "-n", NAMESPACE, "-o", "name",
            "-l", f"slotune.dev/llmdeployment={name},app.kubernetes.io/component={component}",
        ).stdout.split()  # fmt: skip
        found += out
    return found


def records(cluster: Cluster, name: str) -> list[Any]:
    config_map = cluster.get("configmap", f"{name}-trials", NAMESPACE)
    assert config_map is not None
    return loads(config_map["data"]["trials.jsonl"])


class Traffic:
    """Users: the workload's Poisson stream sent to a serving pod, in the background."""

    def __init__(self, ip: str, served: str, rate: float, seconds: float, seed: int) -> None:
        workload = loadgen.Workload(
            num_requests=round(rate * seconds),
            seed=seed,
            rate=rate,
            prompt_tokens=PROMPT_TOKENS,
            prompt_spread=0.1,
            output_tokens=OUTPUT_TOKENS,
        )
        self.results: list[loadgen.RequestResult] = []
        self.thread = threading.Thread(
            target=lambda: self.results.extend(
                asyncio.run(loadgen.run_workload(f"http://{ip}:8000", served, workload))
            ),
            daemon=True,
        )
        self.thread.start()

    def wait(self) -> None:
        self.thread.join(timeout=600)


def explain(cluster: Cluster, kubelet: Kubelet, operator: OperatorPod) -> str:
    events = cluster.kubectl(
        "get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp", check=False
    ).stdout
    trials = []
    for config_map in json.loads(
        cluster.kubectl("get", "configmaps", "-n", NAMESPACE, "-o", "json", check=False).stdout
        or '{"items": []}'
    )["items"]:
        for record in loads((config_map.get("data") or {}).get("trials.jsonl", "")):
            found = record.measurement.capacity if record.measurement else None
            trials.append(
                f"{config_map['metadata']['name']} #{record.number} {record.label} "
                f"{record.phase} {dict(record.params)}: "
                f"{found.describe() if found else record.state}"
            )
    listed = "\n".join(trials)
    return (
        f"\n--- trials\n{listed}\n--- events\n{events}"
        f"\n--- operator log (tail)\n{operator.log()[-6000:]}"
        f"\n--- containers\n{kubelet.log_tails()}"
    )


# --- tests -----------------------------------------------------------------------------------


def test_holds_still_while_prometheus_is_unreachable(
    cluster: Cluster,
    kubelet: Kubelet,
    prometheus: PrometheusServer,
    tuning_operator: Any,
    workload: dict[str, Any],
) -> None:
    """Nothing is launched or decided on a blind spot; once Prometheus answers, it goes on."""
    obj = tiny(
        "held",
        replicas=0,
        tuning={"enabled": True, "maxTrials": 1, "searchSpace": space(2048, seqs=(128,)),
                "workload": workload},
        monitoring={"prometheusURL": "http://127.0.0.1:9"},  # nothing listens there
    )  # fmt: skip
    assert cluster.apply(obj).returncode == 0
    wait_for(
        "MetricsAvailable=False and Tuning held",
        lambda: (
            condition(o := llmd(cluster, "held"), "MetricsAvailable").get("status") == "False"
            and condition(o, "Tuning").get("reason") == "Held"
        ),
    )
    time.sleep(8)  # several resyncs: still nothing may happen
    assert trial_objects(cluster, "held") == []
    assert cluster.get("configmap", "held-trials", NAMESPACE) is None
    message = condition(llmd(cluster, "held"), "MetricsAvailable")["message"]
    assert "127.0.0.1:9" in message

    patch = {"spec": {"monitoring": {"prometheusURL": prometheus.url}}}
    cluster.kubectl(
        "patch", "llmd", "held", "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch)
    )
    wait_for(
        "the study to start once Prometheus answers",
        lambda: tuning_of(cluster, "held").get("current") is not None,
    )
    assert condition(llmd(cluster, "held"), "MetricsAvailable")["status"] == "True"
    cluster.kubectl("delete", "llmd", "held", "-n", NAMESPACE, "--wait=false")
    wait_for("the trial pod to go with its owner", lambda: not trial_objects(cluster, "held"), 120)


def test_tunes_promotes_and_survives_restarts_at_every_step(
    cluster: Cluster,
    kubelet: Kubelet,
    prometheus: PrometheusServer,
    tuning_operator: Any,
    workload: dict[str, Any],
) -> None:
    """The deployment starts on a configuration that misses the SLO on live traffic (as
    Prometheus shows); the study measures vLLM's defaults and that configuration, finds the
    defaults carry the target rate and it does not, re-measures the defaults and promotes
    them; the operator is SIGKILLed at each step of a trial on the way, and no trial is lost,
    repeated or left behind."""
    operator: OperatorPod = tuning_operator
    tuning = {"enabled": False, "maxTrials": 4, "seed": 0, "searchSpace": space(2048),
              "workload": workload}  # fmt: skip
    assert cluster.apply(tiny("chat", tuning=tuning)).returncode == 0
    try:
        ip = wait_for(
            "the serving pod to be ready", lambda: serving_pod(cluster, kubelet, "chat"),
            ENGINE_START,
        )[1]  # fmt: skip
        before = template_hash(cluster, "chat")

        # Users on the deployment's configuration: Prometheus shows the SLO missed.
        window = live_window(workload["requestRate"])
        traffic = Traffic(ip, "chat", workload["requestRate"], window + 15, seed=11)
        missed = wait_for(
            "SLOMet=False from Prometheus on the deployment's configuration",
            lambda: slo_judged(o := llmd(cluster, "chat"), "False") and o,
            window + 90,
        )
        traffic.wait()
        print("Live SLO before tuning:", condition(missed, "SLOMet")["message"])

        # The on-call engineer turns tuning on.
        patch = {"spec": {"tuning": {"enabled": True}}}
        cluster.kubectl(
            "patch", "llmd", "chat", "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch)
        )
        killed = kill_at_each_step(cluster, operator, "chat", 4 * trial_seconds(workload))
        done = wait_for(
            "the study to promote and verify a configuration",
            lambda: (
                tuning_of(cluster, "chat").get("state") in ("Completed", "RolledBack")
                and tuning_of(cluster, "chat")
            ),
            4 * trial_seconds(workload),
            interval=2,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}{explain(cluster, kubelet, operator)}") from None
    print("Operator killed at:", killed)
    print(
        f"The users' rate: {workload['requestRate']} requests/s; "
        f"the study's target: {done.get('targetRate')} requests/s"
    )
    # What each trial measured comes first: a verdict that differs from the story below
    # changes the trials that follow (and whether there is a promotion to kill the operator in).
    kept = records(cluster, "chat")
    for record in kept:
        found = record.measurement.capacity if record.measurement else None
        print(
            f"Trial {record.number} ({record.label}, {record.phase}): "
            f"{found.describe() if found else '-'}"
        )
    assert done["state"] == "Completed", done.get("message")
    assert [r.number for r in kept] == list(range(len(kept))), "a trial was lost or repeated"
    assert [(r.params["max_num_seqs"], r.label, r.phase) for r in kept] == [
        (128, "vllm-defaults", "screen"),
        (1, "current", "screen"),
        (128, "vllm-defaults", "finalist"),
    ], [(r.label, r.phase, r.feasible) for r in kept]
    defaults, current, again = kept
    assert defaults.feasible, defaults.measurement
    assert not current.feasible, current.measurement
    assert again.feasible, again.measurement
    assert {"Launching", "Measuring", "Promoting"} <= {step for step, _ in killed}
    # The capacities are ordered as the configurations' physics says, far apart.
    assert current.measurement is not None
    assert defaults.measurement is not None
    assert current.measurement.capacity_rate * 1.2 < defaults.measurement.capacity_rate
    # Every load Job ran the operator image as a real container (podman, runc).
    loads = [cid for pod, name, cid in kubelet.started if name == LOAD_CONTAINER]
    assert len(loads) >= len(kept), kubelet.started
    assert all(cid.startswith("podman://") for cid in loads), loads
    assert done["promoted"]["params"] == {**defaults.params}
    assert done["promoted"]["trial"] == 0
    assert done["trialsCompleted"] == 3

    # Promoted: the serving Deployment runs the winner; no trial object is left.
    after = template_hash(cluster, "chat")
    assert after != before
    args = cluster.get("deployment", "chat", NAMESPACE)["spec"]["template"]["spec"][  # type: ignore[index]
        "containers"
    ][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "128"
    wait_for("trial pods and load Jobs to be gone", lambda: not trial_objects(cluster, "chat"), 60)

    # Users on the promoted configuration: Prometheus shows the SLO met.
    _, ip = wait_for("the promoted pod", lambda: serving_pod(cluster, kubelet, "chat"), 60)
    traffic = Traffic(ip, "chat", workload["requestRate"], window + 30, seed=12)
    try:
        met = wait_for(
            "SLOMet=True from Prometheus on the promoted configuration",
            lambda: slo_judged(o := llmd(cluster, "chat"), "True") and o,
            window + 90,
        )
    except AssertionError as error:
        slo_met = condition(llmd(cluster, "chat"), "SLOMet")
        raise AssertionError(f"{error}; SLOMet: {slo_met}") from None
    traffic.wait()
    print("Live SLO after promotion:", condition(met, "SLOMet")["message"])
    table = cluster.kubectl("get", "llmd", "-n", NAMESPACE).stdout
    print(table)
    row = next(line for line in table.splitlines() if line.startswith("chat"))
    assert "Ready" in row
    assert "3/4" in row

    # The operator wrote status only: never spec (GitOps tools would see drift).
    managed = json.loads(
        cluster.kubectl(
            "get", "llmd", "chat", "-n", NAMESPACE, "-o", "json", "--show-managed-fields"
        ).stdout
    )["metadata"]["managedFields"]
    for entry in managed:
        if entry["manager"] == "slotune":
            assert entry.get("subresource") == "status" or "f:spec" not in entry["fieldsV1"], entry
    cluster.kubectl("delete", "llmd", "chat", "-n", NAMESPACE, "--wait=false")


def kill_at_each_step(
    cluster: Cluster, operator: OperatorPod, name: str, seconds: float
) -> list[tuple[str, int | None]]:
    """SIGKILLs the operator the first time the study is seen at each step of each trial
    (and while promoting), then starts it again; returns where it was killed."""
    killed: list[tuple[str, int | None]] = []
    seen: set[tuple[str, int | None]] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = tuning_of(cluster, name)
        state = status.get("state")
        if state in ("Completed", "RolledBack", "Recommended"):
            break
        current = status.get("current") or {}
        where = (
            ("Promoting", None)
            if state == "Promoting"
            else (current.get("step"), current.get("number"))
        )
        if where[0] and where not in seen:
            seen.add(where)
            operator.kill()
            killed.append(where)
            operator.start()
        time.sleep(0.3)
    return killed


def test_recommends_then_rolls_back_a_failing_promotion_then_retunes_on_a_violation(
    cluster: Cluster,
    kubelet: Kubelet,
    prometheus: PrometheusServer,
    tuning_operator: Any,
    workload: dict[str, Any],
) -> None:
    """apply: Recommend writes only status. Switched to Auto, the recommendation is promoted;
    its pods fail on the serving node, so it is rolled back with the old pod serving all along.
    Then live traffic violates the SLO for longer than retune.after: a new study starts."""
    operator: OperatorPod = tuning_operator
    tuning = {
        "enabled": True, "apply": "Recommend", "maxTrials": 1,
        "searchSpace": space(2048, seqs=(128,)), "workload": workload,
        "retune": {"onSloViolation": True, "after": "20s", "cooldown": "0s"},
    }  # fmt: skip

    def tuned_serving_pod(pod: Pod) -> bool:
        labels = pod["metadata"].get("labels", {})
        args = pod["spec"]["containers"][0].get("args", [])
        return (
            labels.get("app.kubernetes.io/instance") == "guarded"
            and labels.get("app.kubernetes.io/component") == "serving"
            and args[args.index("--max-num-seqs") + 1] == "128"
        )

    kubelet.fail_pods(tuned_serving_pod, "CUDA error: out of memory (injected on this node)")
    assert cluster.apply(tiny("guarded", tuning=tuning)).returncode == 0
    try:
        wait_for("the serving pod", lambda: serving_pod(cluster, kubelet, "guarded"), ENGINE_START)
        before = template_hash(cluster, "guarded")
        recommended = wait_for(
            "a recommendation",
            lambda: (
                tuning_of(cluster, "guarded").get("state") == "Recommended"
                and tuning_of(cluster, "guarded")
            ),
            trial_seconds(workload),
            interval=2,
        )
        assert template_hash(cluster, "guarded") == before  # Recommend changes nothing
        patch = json.loads(recommended["recommendation"]["patch"])
        assert patch["spec"]["engine"]["args"]["maxNumSeqs"] == 128

        cluster.kubectl(
            "patch", "llmd", "guarded", "-n", NAMESPACE, "--type=merge",
            "-p", json.dumps({"spec": {"tuning": {"apply": "Auto"}}}),
        )  # fmt: skip
        lowest_ready = 1
        deadline = time.monotonic() + ENGINE_START
        while time.monotonic() < deadline:
            deployment = cluster.get("deployment", "guarded", NAMESPACE) or {}
            lowest_ready = min(
                lowest_ready, (deployment.get("status") or {}).get("readyReplicas", 0)
            )
            if tuning_of(cluster, "guarded").get("state") == "RolledBack":
                break
            time.sleep(0.5)
        rolled = tuning_of(cluster, "guarded")
        assert rolled.get("state") == "RolledBack", rolled
        assert "injected" in rolled["message"]
        assert lowest_ready >= 1, "serving capacity was lost during the failed promotion"
        wait_for("the old configuration back", lambda: template_hash(cluster, "guarded") == before)
        reasons = cluster.kubectl(
            "get", "events", "-n", NAMESPACE, "--field-selector=involvedObject.name=guarded",
            "-o", "jsonpath={.items[*].reason}",
        ).stdout.split()  # fmt: skip
        assert "Recommended" in reasons
        assert "RolledBack" in reasons

        # Users on the old configuration miss the SLO; 20 s later a new study starts.
        _, ip = wait_for("a ready pod", lambda: serving_pod(cluster, kubelet, "guarded"), 60)
        window = live_window(workload["requestRate"])
        traffic = Traffic(ip, "guarded", workload["requestRate"], max(60, window + 30), seed=13)
        wait_for(
            "a re-tune after the sustained violation",
            lambda: tuning_of(cluster, "guarded").get("study", 0) >= 2,
            max(90, window + 60),
        )
        traffic.wait()
        retuned = tuning_of(cluster, "guarded")
    except AssertionError as error:
        raise AssertionError(f"{error}{explain(cluster, kubelet, operator)}") from None
    finally:
        kubelet.clear_faults()
        cluster.kubectl("delete", "llmd", "guarded", "-n", NAMESPACE, "--wait=false", check=False)
    print("Re-tune:", retuned.get("reason"))
    assert "SLO" in (retuned.get("reason") or "")
