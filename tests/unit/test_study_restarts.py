"""The cluster study's bookkeeping under operator crashes at every possible point.

`reconcile` runs against an in-memory stand-in for the API server, with a scripted stand-in for
the kubelet, the Job controller and the load Job (trial pods become ready, load Jobs finish
with a measurement that depends on the configuration). The operator is "killed" right before
its N-th write to the API, for every N a whole study makes; a fresh reconcile then carries on
from what the API holds. Every run must end exactly like the run without a crash: the same
trial records (none lost, none repeated), the same promotion, and no trial object left.

The real API server, kubelet and engine play these parts in
tests/integration/test_tuning_in_cluster.py; this test reaches the points between two writes
that killing a real process cannot aim at.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from slotune import render
from slotune.kube import Ref
from slotune.measure.capacity import Capacity
from slotune.measure.record import Measurement
from slotune.reconcile import Monitor, Watch, reconcile
from slotune.study import Live, trials
from slotune.study.observe import KubeObservation
from slotune.tuner.records import loads
from support.memkube import Crash, MemoryApi, roll_out

NAMESPACE = "llm"
NAME = "chat"
UID = "uid-1"


def measured(params: dict[str, Any], target_rate: float) -> Measurement:
    """Small chunked-prefill budgets carry twice the target rate within the ITL target; the
    defaults only half of it."""
    small = params.get("max_num_batched_tokens", 2048) <= 512
    rate = target_rate * (2.0 if small else 0.5)
    found = Capacity(
        capacity=rate,
        upper=rate * 1.12,
        target_rate=target_rate,
        feasible=small,
        stopped="bracketed",
    )
    return Measurement(capacity=found, slo_percentiles={"ttft": 1.0}, completed=45)


def world_step(api: MemoryApi) -> None:
    """What the kubelet, the ReplicaSet and Job controllers and the load Job do meanwhile."""
    for (_, kind, ns, name), obj in list(api.objects.items()):
        labels = obj["metadata"].get("labels", {})
        if kind == "Pod" and labels.get(render.LABEL_COMPONENT) == render.TRIAL_COMPONENT:
            obj["status"] = {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "vllm", "state": {"running": {}}}],
            }
        elif kind == "Job":
            args = obj["spec"]["template"]["spec"]["containers"][0]["args"]
            trial = labels[render.LABEL_TRIAL]
            pod = api.list("v1", "Pod", ns, {render.LABEL_OWNER: NAME,
                                              render.LABEL_COMPONENT: render.TRIAL_COMPONENT,
                                              render.LABEL_TRIAL: trial})  # fmt: skip
            if not pod:  # strategy InPlace: the serving pod runs the trial
                pod = api.list("v1", "Pod", ns, {render.LABEL_COMPONENT: "serving"})
            if not pod:
                continue  # its engine is gone: the operator is cleaning up after the trial
            pod_args = pod[0]["spec"]["containers"][0]["args"]
            params = {
                "max_num_batched_tokens": int(
                    pod_args[pod_args.index("--max-num-batched-tokens") + 1]
                )
            }
            assert "--url" in args
            target = float(args[args.index("--target-rate") + 1])
            message = measured(params, target).model_dump_json()
            job_uid = obj["metadata"]["uid"]
            api.objects[("v1", "Pod", ns, f"{name}-pod")] = {
                "apiVersion": "v1",
                "kind": "Pod",
                # As the Job controller makes it: controlled by the Job, labelled with its UID.
                "metadata": {
                    "name": f"{name}-pod",
                    "namespace": ns,
                    "labels": {"job-name": name, trials.JOB_CONTROLLER_UID: job_uid},
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                         "uid": job_uid, "controller": True}],
                },
                "spec": copy.deepcopy(obj["spec"]["template"]["spec"]),
                "status": {"containerStatuses": [
                    {"name": "load", "state": {"terminated": {"exitCode": 0, "message": message}}}
                ]},
            }  # fmt: skip
        elif kind == "Deployment":
            serve_template(api, obj)
            roll_out(obj)
    # Job pods go with their Job (the garbage collector).
    jobs = {name for (_, kind, _, name) in api.objects if kind == "Job"}
    for key, obj in list(api.objects.items()):
        job = obj["metadata"].get("labels", {}).get("job-name")
        if key[1] == "Pod" and job is not None and job not in jobs:
            del api.objects[key]


def serve_template(api: MemoryApi, obj: dict[str, Any]) -> None:
    """One ready pod runs the Deployment's current template; pods of older ones are gone."""
    template = obj["spec"]["template"]
    labels = template["metadata"]["labels"]
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    wanted = f"{name}-{labels[render.LABEL_CONFIG_HASH]}"
    for key in [k for k in api.objects if k[1] == "Pod" and k[3].startswith(f"{name}-")]:
        pod_labels = api.objects[key]["metadata"].get("labels", {})
        if pod_labels.get(render.LABEL_COMPONENT) == "serving" and key[3] != wanted:
            del api.objects[key]
    api.objects[("v1", "Pod", ns, wanted)] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": wanted, "namespace": ns, "labels": dict(labels)},
        "spec": copy.deepcopy(template["spec"]),
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.9",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "vllm", "restartCount": 0, "state": {"running": {}}}],
        },
    }


def deployment(apply: str = "Auto", strategy: str = "Canary") -> dict[str, Any]:
    return {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": UID, "generation": 1},
        "spec": {
            "model": {"name": "/models/tiny", "servedName": NAME, "source": {"randomWeights": {}}},
            "engine": {"image": "vllm/vllm-openai:v0.32.0", "attentionBackend": "CPU_ATTN",
                       "args": {"maxModelLen": 4096, "maxNumBatchedTokens": 2048,
                                "maxNumSeqs": 128, "blockSize": 128}},
            "resources": {"gpus": 0},
            "slo": {"ttft": {"maxSeconds": 5}, "itl": {"percentile": 99, "maxSeconds": 0.1}},
            "tuning": {
                "enabled": True, "apply": apply, "strategy": strategy, "maxTrials": 4, "seed": 0,
                "searchSpace": {"maxNumBatchedTokens": {"values": [2048, 160]},
                                "maxNumSeqs": {"values": [128, 8]}, "blockSize": {"values": [128]},
                                "enablePrefixCaching": [True], "kvCacheDtype": ["auto"]},
                "workload": {"source": "Synthetic", "promptTokens": {"mean": 2048},
                             "outputTokens": {"mean": 32}, "requestRate": 1.5, "duration": "30s"},
            },
        },
    }  # fmt: skip


def run_study(
    api: MemoryApi,
    strategy: str = "Canary",
    max_passes: int = 400,
    *,
    monitor: Monitor | None = None,
    events: list[str] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Reconciles until the study is over; a Crash aborts one pass, like a killed operator."""
    ref = Ref("slotune.dev/v1alpha1", "LLMDeployment", NAMESPACE, NAME)
    api.objects[MemoryApi._key(ref)] = body or deployment(strategy=strategy)
    now = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    for _ in range(max_passes):
        now += timedelta(seconds=40)
        with contextlib.suppress(Crash):  # the operator died; a new one runs the next pass
            done = reconcile(api.get(ref) or {}, api, now, monitor=monitor)
            if events is not None:
                events += [event.reason for event in done.events]
        world_step(api)
        tuning: dict[str, Any] = (api.get(ref) or {}).get("status", {}).get("tuning", {})
        if tuning.get("state") in ("Completed", "Recommended", "RolledBack"):
            return tuning
    raise AssertionError(f"the study did not end: {tuning}")


def outcome(api: MemoryApi, tuning: dict[str, Any]) -> tuple[Any, ...]:
    config_map = api.get(Ref("v1", "ConfigMap", NAMESPACE, f"{NAME}-trials"))
    assert config_map is not None
    kept = [(r.number, r.phase, r.params["max_num_batched_tokens"], r.feasible)
            for r in loads(config_map["data"]["trials.jsonl"])]  # fmt: skip
    leftovers = [key for key in api.objects if key[1] in ("Job",) or (
        key[1] == "Pod" and "trial" in key[3])]  # fmt: skip
    promoted = (tuning.get("promoted") or {}).get("params")
    return kept, tuning["state"], promoted, leftovers


def clean_run(strategy: str) -> tuple[tuple[Any, ...], int]:
    api = MemoryApi()
    tuning = run_study(api, strategy)
    return outcome(api, tuning), api.writes


@pytest.mark.parametrize("strategy", ["Canary", "InPlace"])
def test_the_study_without_a_crash(strategy: str) -> None:
    (kept, state, promoted, leftovers), _ = clean_run(strategy)
    assert kept == [
        (0, "screen", 2048, False),
        (1, "screen", 160, True),
        (2, "finalist", 160, True),
    ]
    assert state == "Completed"
    assert promoted is not None
    assert promoted["max_num_batched_tokens"] == 160
    assert leftovers == []


CLEAN = {strategy: clean_run(strategy) for strategy in ("Canary", "InPlace")}


@pytest.mark.parametrize(
    ("strategy", "crash_before_write"),
    [(strategy, n) for strategy, (_, writes) in CLEAN.items() for n in range(1, writes + 1)],
)
def test_a_crash_before_any_write_changes_nothing_in_the_end(
    strategy: str, crash_before_write: int
) -> None:
    api = MemoryApi(crash_before_write)
    tuning = run_study(api, strategy)
    assert outcome(api, tuning) == CLEAN[strategy][0]


def test_a_measurement_taken_while_the_gpus_were_throttled_is_taken_again() -> None:
    """Throttled GPUs serve slower than they will: the trial measured meanwhile is discarded
    and measured again once the clocks are back; the study ends as it would have."""
    passes = {"n": 0}

    def throttled_at_first(*_: Any) -> Watch:
        passes["n"] += 1
        return Watch(live=Live(throttled=passes["n"] <= 8))

    api = MemoryApi()
    events: list[str] = []
    tuning = run_study(api, monitor=throttled_at_first, events=events)
    assert "TrialDiscarded" in events
    assert outcome(api, tuning) == CLEAN["Canary"][0]


def test_record_lines_that_do_not_load_are_quarantined_and_the_study_ends_as_it_would_have() -> (
    None
):
    """A hand-edited line, or a NaN stored as null, in `<name>-trials`: moved aside as it was,
    with an Event, and the study, its verdict and the serving go on."""
    bad = ['{"number": 9, "params": {}, "state": "Measured", "score": null}', "not json"]
    passes = {"n": 0}
    api = MemoryApi()

    def corrupting(*_: Any) -> Watch:
        passes["n"] += 1
        key = ("v1", "ConfigMap", NAMESPACE, f"{NAME}-trials")
        if passes["n"] == 6 and key in api.objects:
            data = api.objects[key]["data"]
            data["trials.jsonl"] += "\n".join(bad) + "\n"
        return Watch()

    events: list[str] = []
    tuning = run_study(api, monitor=corrupting, events=events)
    assert events.count("RecordsQuarantined") == 1
    assert outcome(api, tuning) == CLEAN["Canary"][0]
    kept = api.get(Ref("v1", "ConfigMap", NAMESPACE, f"{NAME}-trials"))
    assert kept is not None
    assert kept["data"]["unreadable.jsonl"].splitlines() == bad


def test_quarantined_lines_outlive_the_study_they_came_from() -> None:
    """A new study's first write keeps the lines a person has not cleared yet."""
    api = MemoryApi()
    owner = render.Owner(name=NAME, namespace=NAMESPACE, uid=UID)
    api.apply(render.render_records(owner, 1, "", "not json\n"))
    (config_map,) = [o for k, o in api.objects.items() if k[1] == "ConfigMap"]
    config_map["metadata"]["ownerReferences"] = [owner.reference()]
    seen = KubeObservation(api, owner, "vllm")
    assert seen.records(2) == []
    assert seen.quarantine(2).kept == "not json\n"


def test_the_trial_objects_slotune_created_are_known_by_their_uid() -> None:
    """At every pass, the trial in flight names the UIDs of the trial pod and load Job slotune
    created, as the API server gave them: from the apply itself, not a later read."""
    api = MemoryApi()
    ref = Ref("slotune.dev/v1alpha1", "LLMDeployment", NAMESPACE, NAME)
    api.objects[MemoryApi._key(ref)] = deployment()
    now = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    checked = 0
    for _ in range(400):
        now += timedelta(seconds=40)
        reconcile(api.get(ref) or {}, api, now)
        current = ((api.get(ref) or {}).get("status", {}).get("tuning") or {}).get("current")
        for kind, api_version, name_key, uid_key in (
            ("Pod", "v1", "pod", "podUid"),
            ("Job", "batch/v1", "job", "jobUid"),
        ):
            made = api.get(Ref(api_version, kind, NAMESPACE, (current or {}).get(name_key) or "-"))
            if made is not None and current is not None:
                assert current.get(uid_key) == made["metadata"]["uid"], (kind, current)
                checked += 1
        world_step(api)
        tuning = (api.get(ref) or {}).get("status", {}).get("tuning", {})
        if tuning.get("state") in ("Completed", "Recommended", "RolledBack"):
            break
    assert checked > 5


@pytest.mark.parametrize(
    ("apply", "mode", "state", "patched"),
    [
        # Recommend: the recommendation's patch carries the replicas beside the engine args.
        ("Recommend", "Fixed", "Recommended", 2),
        # Auto with Capacity scaling: the best is promoted and scaling sizes the replicas.
        ("Auto", "Capacity", "Completed", None),
        # Auto with Fixed replicas: slotune never writes spec, so serving stays; the patch says.
        ("Auto", "Fixed", "Completed", 2),
    ],
)
def test_when_no_configuration_carries_the_target_replicas_of_the_best_do(
    monkeypatch: pytest.MonkeyPatch, apply: str, mode: str, state: str, patched: int | None
) -> None:
    """Every configuration carries less than the target (the small budget 0.8 of it, the
    defaults 0.3): two replicas of the best carry it, and the study's outcome says so."""

    def short(params: dict[str, Any], target_rate: float) -> Measurement:
        small = params.get("max_num_batched_tokens", 2048) <= 512
        rate = target_rate * (0.8 if small else 0.3)
        found = Capacity(capacity=rate, upper=rate * 1.12, target_rate=target_rate,
                         feasible=False, stopped="bracketed")  # fmt: skip
        return Measurement(capacity=found, slo_percentiles={"ttft": 1.0}, completed=45)

    monkeypatch.setattr(sys.modules[__name__], "measured", short)
    body = deployment(apply=apply)
    body["spec"]["scaling"] = {"mode": mode}
    api = MemoryApi()
    events: list[str] = []
    tuning = run_study(api, body=body, events=events)
    assert "NoConfigurationMetSLO" in events
    assert tuning["state"] == state
    assert "2 replicas (0 GPUs) of trial" in tuning["message"] or mode == "Capacity"
    recommendation = tuning["recommendation"]
    assert recommendation["replicas"] == 2
    assert json.loads(recommendation["patch"])["spec"].get("replicas") == patched
    kept = tuning["replicaCapacity"]
    assert kept["trial"] == recommendation["trial"]
    promoted = (tuning.get("promoted") or {}).get("trial")
    assert promoted == (recommendation["trial"] if mode == "Capacity" else None)
    if apply == "Recommend":
        # Switched to Auto: one replica of the best would not carry the target, and slotune
        # never writes spec.replicas, so nothing is promoted under Fixed scaling.
        ref = Ref("slotune.dev/v1alpha1", "LLMDeployment", NAMESPACE, NAME)
        obj = api.get(ref) or {}
        obj["spec"]["tuning"]["apply"] = "Auto"
        api.objects[MemoryApi._key(ref)] = obj
        now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
        for n in range(5):
            reconcile(api.get(ref) or {}, api, now + timedelta(seconds=40 * n))
            world_step(api)
        after = (api.get(ref) or {})["status"]["tuning"]
        assert (after["state"], after.get("promoted")) == ("Recommended", None)
