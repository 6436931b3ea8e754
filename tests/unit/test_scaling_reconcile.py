"""Capacity scaling through the whole reconcile, against the in-memory API: the serving
Deployment follows the demand monitoring reads, status and Events give the figures, and an
operator killed before any of its writes loses nothing and flaps nothing.

The real API server, controller-manager, kubelet, engine and Prometheus play these parts in
bench/scaling_in_cluster.py (under live traffic) and in tests/integration/test_operator.py
(`kubectl scale` through the scale subresource).
"""

from __future__ import annotations

import contextlib
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from slotune.kube import Ref
from slotune.reconcile import Watch, reconcile
from slotune.status import Event
from support.memkube import Crash, MemoryApi, roll_out

NAMESPACE = "llm"
NAME = "chat"
REF = Ref("slotune.dev/v1alpha1", "LLMDeployment", NAMESPACE, NAME)
DEPLOYMENT = Ref("apps/v1", "Deployment", NAMESPACE, NAME)
T0 = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)

# The peak arrival rate over the stabilization window, pass by pass, as Prometheus gives it:
# quiet, a surge that needs three replicas of 2 req/s (4.4 / 2), the surge's peak still in the
# window after it ends, then quiet again once the window has passed it.
DEMAND = [1.0] * 4 + [4.0] * 12 + [1.0] * 8


def llmd(scaling: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-1", "generation": 1},
        "spec": {
            "model": {"name": "/models/tiny", "source": {"randomWeights": {}}},
            "replicas": replicas,
            "slo": {"ttft": {"maxSeconds": 2}},
            "scaling": scaling,
        },
    }


def deployment_ready(api: MemoryApi) -> None:
    """The Deployment controller and kubelet: every replica ready."""
    obj = api.objects.get(MemoryApi._key(DEPLOYMENT))
    if obj is not None:
        roll_out(obj)


def run(api: MemoryApi, scaling: dict[str, Any]) -> tuple[list[int], list[Event]]:
    """One pass per demand reading; a Crash aborts a pass, like a killed operator. Returns the
    Deployment's replicas after each pass and the Events of the passes that finished."""
    api.objects[MemoryApi._key(REF)] = llmd(scaling)
    passes = iter(DEMAND)
    demand = {"now": DEMAND[0]}

    def monitor(*_: Any) -> Watch:
        return Watch(demand=demand["now"])

    counts: list[int] = []
    events: list[Event] = []
    for n, reading in enumerate(passes):
        demand["now"] = reading
        with contextlib.suppress(Crash):
            done = reconcile(
                api.get(REF) or {}, api, T0 + timedelta(seconds=30 * n), monitor=monitor
            )
            events += done.events
        deployment_ready(api)
        found = api.get(DEPLOYMENT)
        counts.append(found["spec"]["replicas"] if found else 0)
    return counts, events


CAPACITY = {"mode": "Capacity", "capacityPerReplica": 2.0, "maxReplicas": 5}


def test_the_replicas_follow_the_peak_demand() -> None:
    api = MemoryApi()
    counts, events = run(api, CAPACITY)
    assert counts == [1] * 4 + [3] * 12 + [1] * 8
    scaled = [(e.reason, e.message) for e in events if e.reason.startswith("Scaled")]
    assert scaled == [
        ("ScaledOut", "demand 4 req/s x 1.1 > 1 x 2 req/s: 1 → 3 replicas"),
        ("ScaledIn", "demand 1 req/s x 1.1 <= 1 x 2 req/s: 3 → 1 replicas"),
    ]
    status = (api.get(REF) or {})["status"]
    assert status["selector"] == (
        "app.kubernetes.io/component=serving,app.kubernetes.io/instance=chat,"
        "app.kubernetes.io/name=vllm"
    )
    assert status["replicas"] == 1
    assert status["scaling"]["desiredReplicas"] == 1
    assert status["scaling"]["capacitySource"] == "spec.scaling.capacityPerReplica"
    limited = next(c for c in status["conditions"] if c["type"] == "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("False", "WithinBounds")


def writes_of_a_clean_run() -> int:
    api = MemoryApi()
    run(api, CAPACITY)
    return api.writes


CLEAN_WRITES = writes_of_a_clean_run()


@pytest.mark.parametrize("crash_before_write", range(1, CLEAN_WRITES + 1))
def test_a_crash_before_any_write_loses_nothing_and_flaps_nothing(crash_before_write: int) -> None:
    """Killed before its N-th write, the operator's next pass decides from what Prometheus and
    the API hold: the count never goes back down during the surge, nor up after it, and ends
    where the run without a crash ends."""
    api = MemoryApi(crash_before_write)
    counts, _ = run(api, CAPACITY)
    surge = counts[4:16]
    assert all(a <= b for a, b in itertools.pairwise(surge)), counts
    assert set(surge) <= {1, 3}, counts
    after = counts[16:]
    assert all(a >= b for a, b in itertools.pairwise(after)), counts
    assert counts[-1] == 1
    assert (api.get(REF) or {})["status"]["scaling"]["desiredReplicas"] == 1


def test_external_scaling_follows_spec_replicas_and_publishes_the_figures() -> None:
    """An HPA writes spec.replicas through the scale subresource; slotune never overrides it,
    whatever the demand, and publishes the replicas the demand needs."""
    api = MemoryApi()
    api.objects[MemoryApi._key(REF)] = llmd({"mode": "External", "capacityPerReplica": 2.0}, 2)
    done = reconcile(api.get(REF) or {}, api, T0, monitor=lambda *_: Watch(demand=9.0))
    assert (api.get(DEPLOYMENT) or {})["spec"]["replicas"] == 2
    assert not [e for e in done.events if e.reason.startswith("Scaled")]
    scaling = (api.get(REF) or {})["status"]["scaling"]
    assert (scaling["mode"], scaling["neededReplicas"], scaling["desiredReplicas"]) == (
        "External",
        5,
        2,
    )
    assert not [c for c in (api.get(REF) or {})["status"]["conditions"]
                if c["type"] == "ScalingLimited"]  # fmt: skip


def test_fixed_scaling_shows_no_scaling_status() -> None:
    api = MemoryApi()
    api.objects[MemoryApi._key(REF)] = llmd({}, 2)
    reconcile(api.get(REF) or {}, api, T0, monitor=lambda *_: Watch(demand=9.0))
    assert (api.get(DEPLOYMENT) or {})["spec"]["replicas"] == 2
    assert "scaling" not in (api.get(REF) or {})["status"]


def test_an_unschedulable_replica_stops_the_scale_up_and_says_what_it_needs() -> None:
    api = MemoryApi()
    api.objects[MemoryApi._key(REF)] = llmd(CAPACITY)
    reconcile(api.get(REF) or {}, api, T0, monitor=lambda *_: Watch(demand=2.5))
    found = api.objects[MemoryApi._key(DEPLOYMENT)]
    assert found["spec"]["replicas"] == 2
    # One replica runs; the second waits for a GPU that no node has free.
    found["status"] = {"observedGeneration": found["metadata"]["generation"], "replicas": 2,
                       "updatedReplicas": 2, "readyReplicas": 1}  # fmt: skip
    labels = found["spec"]["template"]["metadata"]["labels"]
    api.objects[("v1", "Pod", NAMESPACE, f"{NAME}-abc-x1")] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{NAME}-abc-x1", "namespace": NAMESPACE, "labels": dict(labels),
                     "ownerReferences": [{"kind": "ReplicaSet", "name": f"{NAME}-abc",
                                          "controller": True, "uid": "rs-1"}]},
        "status": {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]},
    }  # fmt: skip
    reconcile(
        api.get(REF) or {}, api, T0 + timedelta(minutes=1), monitor=lambda *_: Watch(demand=9.0)
    )
    assert (api.get(DEPLOYMENT) or {})["spec"]["replicas"] == 2
    status = (api.get(REF) or {})["status"]
    limited = next(c for c in status["conditions"] if c["type"] == "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in limited["message"]
    assert "of the 5 needed" in limited["message"]


@pytest.mark.parametrize(("mode", "ready", "progressing"), [
    ("Capacity", "True", "ScalingOut"),
    ("External", "True", "ScalingOut"),
    ("Fixed", "False", "RollingOut"),
])  # fmt: skip
def test_an_autoscaled_deployment_stays_ready_while_it_adds_replicas(
    mode: str, ready: str, progressing: str
) -> None:
    """One of three replicas ready, all on the current template: an autoscaled deployment
    serves on the one it had while the others start (Ready, Progressing ScalingOut); under
    Fixed scaling the user asked for three, and Ready waits for them."""
    api = MemoryApi()
    api.objects[MemoryApi._key(REF)] = llmd({"mode": mode, "capacityPerReplica": 2.0}, 3)
    monitor = lambda *_: Watch(demand=4.0)  # noqa: E731 - three replicas' worth
    reconcile(api.get(REF) or {}, api, T0, monitor=monitor)
    found = api.objects[MemoryApi._key(DEPLOYMENT)]
    assert found["spec"]["replicas"] == 3
    found["status"] = {"observedGeneration": found["metadata"]["generation"], "replicas": 3,
                       "updatedReplicas": 3, "readyReplicas": 1}  # fmt: skip
    reconcile(api.get(REF) or {}, api, T0 + timedelta(seconds=30), monitor=monitor)
    conditions = {c["type"]: c for c in (api.get(REF) or {})["status"]["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Progressing"]["reason"]) == (
        ready,
        progressing,
    )
    assert conditions["Ready"]["message"] == "1 of 3 replicas ready"
