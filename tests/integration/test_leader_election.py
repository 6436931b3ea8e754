"""Two operator replicas on one Lease: one acts, the other stands by and takes over when the
leader dies (SIGKILL: within the lease's 15 s plus a 2 s retry) or stops (at once)."""

from __future__ import annotations

import time
from pathlib import Path

from slotune.leader import Timing
from support.cluster import OPERATOR_NAMESPACE, ROOT, Cluster, OperatorProcess, llmd, wait_for


def replica(kubeconfig: Path, log: Path, namespace: str, lease: str, name: str) -> OperatorProcess:
    """One replica as the chart runs it, watching only `namespace`."""
    return OperatorProcess(
        kubeconfig,
        log,
        env={
            "SLOTUNE_LEADER_ELECTION": f"{OPERATOR_NAMESPACE}/{lease}",
            "SLOTUNE_POD_NAME": name,
        },
        argv=[
            *OperatorProcess(kubeconfig, log).argv,
            f"--namespace={namespace}",
        ],
    )


def holder(cluster: Cluster, lease: str) -> str:
    obj = cluster.get("lease", lease, OPERATOR_NAMESPACE)
    return ((obj or {}).get("spec") or {}).get("holderIdentity") or ""


def generation_seen(cluster: Cluster, name: str, namespace: str, generation: int) -> bool:
    obj = cluster.get("llmd", name, namespace)
    return bool(obj and (obj.get("status") or {}).get("observedGeneration") == generation)


def test_one_replica_acts_and_the_standby_takes_over(
    cluster: Cluster,
    operator: OperatorProcess,
    operator_kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    lease = f"leader-{namespace}"
    a = replica(operator_kubeconfig, tmp_path / "a.log", namespace, lease, "replica-a")
    b = replica(operator_kubeconfig, tmp_path / "b.log", namespace, lease, "replica-b")
    operator.stop()  # the other tests' operator: for this test, the replicas act alone
    try:
        a.start()
        assert holder(cluster, lease) == "replica-a"
        b.start(ready="Standing by")
        assert "held by replica-a" in b.log()

        obj = llmd("led", namespace)
        assert cluster.apply(obj).returncode == 0
        wait_for("status from the leader", lambda: generation_seen(cluster, "led", namespace, 1))
        time.sleep(5)  # a few resyncs: the standby must have done nothing meanwhile
        assert "Started the slotune operator" not in b.log()
        assert "Updated status" not in b.log()
        assert f"Updated status of {namespace}/led" in a.log()

        # The leader dies without a word: the standby leads within the lease's bound.
        a.kill()
        killed = time.monotonic()
        wait_for("replica-b to lead", lambda: "Leading" in b.log(), timeout=40)
        takeover = time.monotonic() - killed
        bound = Timing().takeover_bound
        print(f"\ntakeover after SIGKILL: {takeover:.1f} s (bound {bound:.0f} s)")
        assert takeover <= bound + 2  # + a poll of the log
        assert holder(cluster, lease) == "replica-b"
        wait_for("replica-b to start", lambda: "Started the slotune operator" in b.log())
        obj["spec"]["replicas"] = 2
        assert cluster.apply(obj).returncode == 0
        wait_for("the new leader's status", lambda: generation_seen(cluster, "led", namespace, 2))

        # A clean stop hands the Lease over at once: a restarted replica-a stands by, then
        # leads within a retry period of replica-b's stop.
        a.start(ready="Standing by")
        b.stop()
        stopped = time.monotonic()
        assert "Released the Lease" in b.log()
        wait_for("replica-a to lead again", lambda: holder(cluster, lease) == "replica-a")
        handover = time.monotonic() - stopped
        print(f"handover after a clean stop: {handover:.1f} s")
        assert handover <= Timing().retry_seconds + 3
    finally:
        a.stop()
        b.stop()
        operator.start()


def test_in_namespace_mode_a_killed_leaders_successor_repairs_at_once(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    """The chart with `watchNamespaces` (its own RBAC, nothing cluster-wide but CRDs and the
    namespace list), two replicas at the production resync (30 s): each starts serving without
    retrying for permissions, and after the leader's SIGKILL the successor repairs a deleted
    Deployment from its watch, not from the next resync."""
    system = f"{namespace}-system"
    cluster.kubectl("create", "namespace", system)
    rendered = cluster.helm(
        "template", "nsmode", str(ROOT / "charts" / "slotune"),
        "--namespace", system, "--set", f"watchNamespaces={{{namespace}}}",
        "--show-only", "templates/serviceaccount.yaml",
        "--show-only", "templates/clusterrole.yaml",
        "--show-only", "templates/clusterrolebinding.yaml",
        "--show-only", "templates/role.yaml",
        "--show-only", "templates/rolebinding.yaml",
    )  # fmt: skip
    applied = cluster.apply(rendered)
    assert applied.returncode == 0, applied.stderr
    token = cluster.kubectl(
        "create", "token", "nsmode-slotune", "-n", system, "--duration=1h"
    ).stdout.strip()
    kubeconfig = cluster.plane.kubeconfig_for_token(token, tmp_path / "kubeconfig")

    def scoped(name: str) -> OperatorProcess:
        return OperatorProcess(
            kubeconfig,
            tmp_path / f"{name}.log",
            env={
                "SLOTUNE_LEADER_ELECTION": f"{system}/leader",
                "SLOTUNE_POD_NAME": name,
                "SLOTUNE_RESYNC_SECONDS": "30",  # the production default
            },
            argv=[
                *OperatorProcess(kubeconfig, tmp_path / "x.log").argv,
                f"--namespace={namespace}",
            ],
        )

    a, b = scoped("replica-a"), scoped("replica-b")
    operator.stop()  # the other tests' operator: for this test, the replicas act alone
    try:
        a.start()
        b.start(ready="Standing by")
        obj = llmd("scoped", namespace)
        assert cluster.apply(obj).returncode == 0
        wait_for("status from the leader", lambda: generation_seen(cluster, "scoped", namespace, 1))
        served = wait_for("the Deployment", lambda: cluster.get("deployment", "scoped", namespace))

        a.kill()
        killed = time.monotonic()
        wait_for("replica-b to start", lambda: "Started the slotune operator" in b.log(), 40)
        started = time.monotonic()
        cluster.kubectl("delete", "deployment", "scoped", "-n", namespace, "--wait=true")
        deleted = time.monotonic()
        wait_for(
            "the Deployment repaired by the successor",
            lambda: (
                (d := cluster.get("deployment", "scoped", namespace))
                and d["metadata"]["uid"] != served["metadata"]["uid"]
            ),
            timeout=40,
        )
        repaired = time.monotonic()
        print(
            f"\nnamespace mode: successor started {started - killed:.1f} s after the SIGKILL; "
            f"a deleted Deployment repaired {repaired - deleted:.1f} s after the delete "
            f"({repaired - killed:.1f} s after the SIGKILL)"
        )
        assert repaired - deleted <= 20
        for log in (a.log(), b.log()):
            assert "Not enough permissions" not in log
            assert "[ERROR" not in log, log
    finally:
        a.stop()
        b.stop()
        operator.start()
