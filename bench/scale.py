"""Benchmark: the operator with hundreds of LLMDeployments, on the project's own control plane
(upstream etcd, kube-apiserver, kube-controller-manager), the chart's RBAC, the production
resync of 30 s, and no nodes.

Every figure about API traffic comes from the API server's audit log, filtered to the
operator's ServiceAccount: what the server saw, whoever in the operator (slotune's client or
Kopf's) sent it. Reconcile durations come from the operator's own histogram, CPU and memory
from /proc.

Cases (`--cases`, all but churn by default):

- steady: N objects, converged; for `--window` seconds, the operator's requests per second
  (per object, and by verb and resource), status writes, reconcile p50/p99, CPU, RSS.
- hanging: a Prometheus that accepts connections and never answers, named by 50 of the
  objects; then a spec change on 10 objects that do not use it and 10 that do, and the
  time each takes to be reconciled (observedGeneration).
- failing: 20 objects in a namespace whose quota allows no Service; how soon their status
  says so, and the operator's request rate in 15 s bins as its retries back off.
- storm: one field changed on all N objects at once; the time until all are reconciled, and
  the HTTP 429s the operator got.
- delete: all N deleted at once; 429s, and the operator's RSS after it settles (sampled for
  two minutes once the children are gone too).
- churn (not in the default set): all N deleted and created again, `--churn-cycles` times;
  the RSS with N and with none after each cycle.
- replicas: two replicas on one Lease for `--window` seconds with churn (10 spec changes
  every 10 s): status writes and Events by each replica (told apart by their tokens), then
  the leader killed and the time until the other leads.

    PYTHONPATH=tests .venv/bin/python bench/scale.py --objects 500

`--operator-python` runs another checkout's operator (its venv's python) against the same
bench: the figures before a change, side by side with after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from support.cluster import OPERATOR_NAMESPACE, SERVICE_ACCOUNT, Cluster, llmd
from support.controlplane import ControlPlane, bin_dir_from_env
from support.hanging import HangingServer
from support.procs import free_ports

ROOT = Path(__file__).resolve().parents[1]
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}"
GROUP, VERSION, PLURAL = "slotune.dev", "v1alpha1", "llmdeployments"
PER_NAMESPACE = 50

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


# --- what the API server saw -------------------------------------------------------------


class Audit:
    """The audit log, read incrementally: the operator's requests since the last mark."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.records: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return self.records
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            event = json.loads(line)
            if event.get("user", {}).get("username") != OPERATOR_USER:
                continue
            if event.get("stage") != "ResponseComplete":
                continue
            ref = event.get("objectRef") or {}
            self.records.append(
                {
                    "at": _epoch(event["requestReceivedTimestamp"]),
                    "verb": event["verb"],
                    "resource": ref.get("resource", event.get("requestURI", "?").split("?")[0]),
                    "subresource": ref.get("subresource", ""),
                    "namespace": ref.get("namespace", ""),
                    "code": (event.get("responseStatus") or {}).get("code", 0),
                    "credential": ",".join(
                        (event["user"].get("extra") or {}).get(
                            "authentication.kubernetes.io/credential-id", []
                        )
                    ),
                }
            )
        return self.records

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        return [r for r in self.read() if start <= r["at"] < end]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def kinds(calls: list[dict[str, Any]]) -> Counter[str]:
    """Requests by verb and resource, e.g. `patch llmdeployments/status`."""
    return Counter(
        f"{r['verb']} {r['resource']}{'/' + r['subresource'] if r['subresource'] else ''}"
        for r in calls
    )


def short_calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests other than watches (a watch is one long request)."""
    return [r for r in records if r["verb"] != "watch"]


# --- the operator as a process -----------------------------------------------------------


class Operator:
    def __init__(
        self, python: str, kubeconfig: Path, log: Path, env: dict[str, str], metrics_port: int
    ) -> None:
        self.log = log
        self.metrics_port = metrics_port
        self.process = subprocess.Popen(
            [python, "-m", "slotune.cli", "operator", f"--kubeconfig={kubeconfig}"],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "SLOTUNE_RESYNC_SECONDS": "30",
                "SLOTUNE_METRICS_PORT": str(metrics_port),
                **env,
            },
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, line: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the operator never logged {line!r}:\n{self.text()[-3000:]}")
            time.sleep(0.5)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def reconcile_buckets(self) -> dict[float, float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        buckets: dict[float, float] = {}
        for match in re.finditer(
            r'^slotune_reconcile_duration_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M
        ):
            bound = float("inf") if match.group(1) == "+Inf" else float(match.group(1))
            buckets[bound] = float(match.group(2))
        return buckets

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> str:
    """The bucket bound the q-quantile of the reconciles between two scrapes falls under."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0
    if total <= 0:
        return "no reconciles"
    for bound, count in zip(bounds, counts, strict=True):
        if count >= q * total:
            return f"<= {bound:g} s" if bound != float("inf") else "> 60 s"
    return "?"


# --- the bench ---------------------------------------------------------------------------


class Bench:
    """The cases, against a started control plane with slotune's CRD."""

    def __init__(self, args: argparse.Namespace, work: Path, plane: ControlPlane, audit: Audit):
        self.args = args
        self.work = work
        self.plane = plane
        self.audit = audit
        self.cluster = Cluster(plane, plane.bin_dir)
        self.cluster.install_crd()
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(plane.admin_kubeconfig), client_configuration=config
        )
        config.connection_pool_maxsize = 32
        client = kubernetes.client.ApiClient(config)
        self.api = kubernetes.client.CustomObjectsApi(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.results: dict[str, Any] = {}

    def kubeconfig(self, name: str) -> Path:
        """A kubeconfig with a token of its own for the chart's ServiceAccount (installed on
        first use): the audit log tells two replicas apart by their tokens."""
        path = self.work / f"{name}.kubeconfig"
        if not (self.work / "operator.kubeconfig").exists():
            self.cluster.install_operator_rbac(self.work / "operator.kubeconfig")
        if path.exists():
            return path
        token = self.cluster.kubectl(
            "create", "token", SERVICE_ACCOUNT, "-n", OPERATOR_NAMESPACE, "--duration=4h"
        ).stdout.strip()
        return self.plane.kubeconfig_for_token(token, path)

    def operator(self, name: str, env: dict[str, str] | None = None) -> Operator:
        (port,) = free_ports(1)
        return Operator(
            self.args.operator_python,
            self.kubeconfig(name),
            self.work / f"{name}.log",
            env or {},
            port,
        )

    def namespaces(self, prefix: str, count: int) -> list[str]:
        names = [f"{prefix}{i}" for i in range((count + PER_NAMESPACE - 1) // PER_NAMESPACE)]
        for ns in names:
            self.cluster.kubectl("create", "namespace", ns, check=False)
        return names

    def create(self, objects: list[dict[str, Any]]) -> None:
        api = self.api

        def one(obj: dict[str, Any]) -> None:
            api.create_namespaced_custom_object(
                GROUP, VERSION, obj["metadata"]["namespace"], PLURAL, obj
            )

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, objects))

    def fleet(self, namespaces: list[str]) -> list[dict[str, Any]]:
        """The N objects every case starts from, PER_NAMESPACE to a namespace."""
        return [
            llmd(f"o{i % PER_NAMESPACE}", namespaces[i // PER_NAMESPACE])
            for i in range(self.args.objects)
        ]

    def generations(self, namespaces: list[str]) -> dict[tuple[str, str], tuple[int, int]]:
        """(namespace, name) -> (generation, observedGeneration) of every object."""
        seen = {}
        for ns in namespaces:
            for obj in self.api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
                meta = obj["metadata"]
                observed = (obj.get("status") or {}).get("observedGeneration", 0)
                seen[(ns, meta["name"])] = (meta.get("generation", 1), observed)
        return seen

    def children(self) -> int:
        """How many of the operator's children are left, in all namespaces: Deployments,
        Services, and the Deployments' Pods (pending: the bench's cluster has no nodes)."""
        selector = "app.kubernetes.io/managed-by=slotune"
        lists = (
            self.apps.list_deployment_for_all_namespaces,
            self.core.list_service_for_all_namespaces,
            self.core.list_pod_for_all_namespaces,
        )
        return sum(len(list_(label_selector=selector).items) for list_ in lists)

    def wait_converged(self, namespaces: list[str], count: int, timeout: float, what: str) -> float:
        started = time.monotonic()
        while True:
            seen = self.generations(namespaces)
            done = sum(1 for g, o in seen.values() if o >= g)
            if len(seen) >= count and done >= count:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise SystemExit(f"{what}: {done} of {count} converged after {timeout:.0f} s")
            time.sleep(1)

    # cases

    def steady(self, operator: Operator, namespaces: list[str]) -> None:
        n = self.args.objects
        window = self.args.window
        time.sleep(35)  # past one full resync after convergence
        before, cpu0 = operator.reconcile_buckets(), operator.cpu_seconds()
        rss0 = operator.rss_mib()
        start = time.time()
        time.sleep(window)
        end = time.time()
        after, cpu1 = operator.reconcile_buckets(), operator.cpu_seconds()
        time.sleep(2)  # the audit log's last lines
        calls = short_calls(self.audit.between(start, end))
        by_kind = kinds(calls)
        status_writes = sum(
            1
            for r in calls
            if r["resource"] == PLURAL and r["subresource"] == "status" and r["verb"] == "patch"
        )
        self.results["steady"] = {
            "objects": n,
            "window_s": window,
            "requests_per_s": round(len(calls) / window, 2),
            "requests_per_s_per_object": round(len(calls) / window / n, 4),
            "by_kind_per_s": {k: round(v / window, 2) for k, v in by_kind.most_common(8)},
            "status_writes": status_writes,
            "reconcile_p50": quantile(before, after, 0.5),
            "reconcile_p99": quantile(before, after, 0.99),
            "cpu_share_of_a_core": round((cpu1 - cpu0) / window, 3),
            "rss_mib_start": round(rss0, 1),
            "rss_mib_end": round(operator.rss_mib(), 1),
        }
        self.report("steady")

    def hanging(self, operator: Operator, healthy: list[str]) -> None:
        server = HangingServer()
        sick = self.namespaces("sick", 50)
        objects = [
            llmd(f"m{i}", sick[0], monitoring={"prometheusURL": server.url}) for i in range(50)
        ]
        created = time.monotonic()
        self.create(objects)
        self.wait_converged(sick, 50, 600, "objects using a hanging Prometheus")
        create_s = time.monotonic() - created
        time.sleep(10)
        unrelated = self.edit_and_time([(healthy[0], f"o{i}") for i in range(10)], healthy)
        related = self.edit_and_time([(sick[0], f"m{i}") for i in range(10)], sick)
        self.results["hanging"] = {
            "create_50_using_it_s": round(create_s, 1),
            "unrelated_spec_change_median_s": round(statistics.median(unrelated), 1),
            "unrelated_spec_change_max_s": round(max(unrelated), 1),
            "related_spec_change_median_s": round(statistics.median(related), 1),
            "related_spec_change_max_s": round(max(related), 1),
            "connections_to_it": server.accepted,
        }
        self.report("hanging")
        server.close()
        self.delete_namespaces(sick)

    def edit_and_time(self, keys: list[tuple[str, str]], namespaces: list[str]) -> list[float]:
        """Changes one spec field of each object at once; seconds until each is reconciled."""
        started = time.monotonic()
        targets = {}
        for ns, name in keys:
            obj = self.api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            seqs = obj["spec"]["engine"]["args"]["maxNumSeqs"]
            patch = {"spec": {"engine": {"args": {"maxNumSeqs": 64 if seqs != 64 else 32}}}}
            edited = self.api.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, patch
            )
            targets[(ns, name)] = edited["metadata"]["generation"]
        took: dict[tuple[str, str], float] = {}
        while len(took) < len(targets) and time.monotonic() - started < 600:
            seen = self.generations(sorted({ns for ns, _ in keys}))
            for key, generation in targets.items():
                if key not in took and seen.get(key, (0, 0))[1] >= generation:
                    took[key] = time.monotonic() - started
            time.sleep(0.25)
        return [took.get(key, float("inf")) for key in targets]

    def failing(self, operator: Operator) -> None:
        (ns,) = self.namespaces("quota", 20)
        self.cluster.kubectl("create", "quota", "no-services", "--hard=services=0", "-n", ns)
        start = time.time()
        self.create([llmd(f"q{i}", ns) for i in range(20)])
        first_condition = None
        bins = 8
        while time.time() - start < 15 * bins:
            if first_condition is None:
                items = self.api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
                degraded = [
                    o
                    for o in items["items"]
                    if any(
                        c.get("reason") == "ApplyFailed"
                        for c in (o.get("status") or {}).get("conditions", [])
                    )
                ]
                if len(degraded) == 20:
                    first_condition = time.time() - start
            time.sleep(1)
        time.sleep(2)
        calls = short_calls(self.audit.between(start, start + 15 * bins))
        calls = [r for r in calls if r["namespace"] == ns]
        rates = [
            round(sum(1 for r in calls if start + 15 * i <= r["at"] < start + 15 * (i + 1)) / 15, 2)
            for i in range(bins)
        ]
        self.results["failing"] = {
            "objects": 20,
            "all_20_have_the_condition_after_s": first_condition,
            "requests_per_s_in_15s_bins": rates,
        }
        self.report("failing")
        self.delete_namespaces([ns])

    def storm(self, operator: Operator, namespaces: list[str]) -> None:
        api = self.api
        start = time.time()
        started = time.monotonic()

        def edit(key: tuple[str, str]) -> None:
            api.patch_namespaced_custom_object(
                GROUP, VERSION, key[0], PLURAL, key[1], {"spec": {"replicas": 2}}
            )

        keys = list(self.generations(namespaces))
        cpu = operator.cpu_seconds()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(edit, keys))
        self.wait_converged(namespaces, len(keys), 900, "the update storm")
        converged = time.monotonic() - started  # from the first edit
        cpu = operator.cpu_seconds() - cpu
        time.sleep(5)
        calls = short_calls(self.audit.between(start, time.time()))
        self.results["storm"] = {
            "objects": len(keys),
            "converged_after_s": round(converged, 1),
            "operator_cpu_s": round(cpu, 1),
            "http_429": sum(1 for r in calls if r["code"] == 429),
            "operator_requests": len(calls),
            "requests_per_object": round(len(calls) / len(keys), 2),
            "by_kind_per_object": {
                k: round(v / len(keys), 2) for k, v in kinds(calls).most_common(8)
            },
        }
        self.report("storm")

    def delete_all(self, namespaces: list[str]) -> tuple[float, float]:
        """Deletes every object at once; seconds until they are gone, and until their children
        are: the garbage collector deletes the children after their owners, and the operator
        watches (and Kopf remembers) each child until its DELETED event."""
        start = time.time()
        for ns in namespaces:
            self.api.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        deadline = time.monotonic() + 600
        while any(self.generations(namespaces)) and time.monotonic() < deadline:
            time.sleep(1)
        gone = time.time() - start
        while self.children() and time.monotonic() < deadline:
            time.sleep(1)
        return gone, time.time() - start

    def delete(self, operator: Operator, namespaces: list[str]) -> None:
        start = time.time()
        gone, children_gone = self.delete_all(namespaces)
        # Then the operator settles: its resync trims the heap once a period (30 s here).
        rss = []
        for _ in range(4):
            time.sleep(30)
            rss.append(round(operator.rss_mib(), 1))
        calls = short_calls(self.audit.between(start, time.time()))
        self.results["delete"] = {
            "all_gone_after_s": round(gone, 1),
            "children_gone_after_s": round(children_gone, 1),
            "http_429": sum(1 for r in calls if r["code"] == 429),
            "operator_requests": len(calls),
            "by_kind": dict(kinds(calls).most_common(8)),
            "rss_mib_every_30s_after": rss,
            "rss_mib_after_settling": rss[-1],
        }
        self.report("delete")

    def churn(self, operator: Operator, namespaces: list[str], cycles: int) -> None:
        """Deletes all N and creates them again, `cycles` times, ending deleted: the RSS with
        N objects and with none after each cycle (a resync period and more after the last
        child is gone: the resync trims the heap). Growth from cycle to cycle is a leak."""
        rows = []
        for cycle in range(cycles):
            if cycle:
                self.create(self.fleet(namespaces))
                self.wait_converged(
                    namespaces, self.args.objects, 1800, f"creating, cycle {cycle + 1}"
                )
            with_objects = operator.rss_mib()
            self.delete_all(namespaces)
            time.sleep(45)
            rows.append(
                {
                    "rss_mib_with_objects": round(with_objects, 1),
                    "rss_mib_none": round(operator.rss_mib(), 1),
                }
            )
        self.results["churn"] = {"objects": self.args.objects, "cycles": rows}
        self.report("churn")

    def replicas(self, namespaces: list[str]) -> None:
        lease = {"SLOTUNE_LEADER_ELECTION": f"{OPERATOR_NAMESPACE}/bench"}
        a = self.operator("replica-a", {**lease, "SLOTUNE_POD_NAME": "replica-a"})
        a.wait_for_log("Started the slotune operator")
        b = self.operator("replica-b", {**lease, "SLOTUNE_POD_NAME": "replica-b"})
        try:
            if "Standing by" not in _wait_any(b, ["Standing by", "Started the slotune"]):
                self.results["replicas"] = {"error": "no leader election: both replicas act"}
            start = time.time()
            keys = list(self.generations(namespaces))[:10]
            end = start + self.args.replicas_window
            flip = 0
            while time.time() < end:
                flip ^= 1
                for ns, name in keys:
                    self.api.patch_namespaced_custom_object(
                        GROUP, VERSION, ns, PLURAL, name, {"spec": {"replicas": 1 + flip}}
                    )
                time.sleep(10)
            time.sleep(2)
            calls = short_calls(self.audit.between(start, time.time()))
            by_replica: dict[str, Counter[str]] = {}
            for r in calls:
                kind = (
                    "status writes"
                    if r["subresource"] == "status" and r["verb"] == "patch"
                    else "events"
                    if r["resource"] == "events" and r["verb"] == "create"
                    else None
                )
                if kind:
                    by_replica.setdefault(r["credential"], Counter())[kind] += 1
            killed = time.monotonic()
            a.stop(signal.SIGKILL)
            _wait_any(b, ["Leading"], timeout=60)
            self.results.setdefault("replicas", {}).update(
                {
                    "window_s": self.args.replicas_window,
                    "writes_by_token": {
                        f"token {i + 1}": dict(c) for i, c in enumerate(by_replica.values())
                    },
                    "tokens_that_wrote": len(by_replica),
                    "takeover_after_sigkill_s": round(time.monotonic() - killed, 1),
                }
            )
        finally:
            a.stop()
            b.stop()
        self.report("replicas")

    def delete_namespaces(self, namespaces: list[str]) -> None:
        for ns in namespaces:
            self.cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

    def report(self, case: str) -> None:
        print(f"\n== {case}", flush=True)
        for key, value in self.results[case].items():
            print(f"   {key}: {value}", flush=True)


def _wait_any(operator: Operator, lines: list[str], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = operator.text()
        for line in lines:
            if line in text:
                return line
        time.sleep(0.5)
    raise SystemExit(f"none of {lines} in {operator.log}")


@contextmanager
def workdir(keep: str | None) -> Iterator[Path]:
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="slotune-scale-") as tmp:
        yield Path(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument(
        "--window",
        type=float,
        default=330,
        help="seconds to measure the steady state over: longer than the operator's cache's "
        "5 minutes, so that the re-reads it makes are counted",
    )
    parser.add_argument(
        "--replicas-window", type=float, default=120, help="seconds two replicas run with churn"
    )
    parser.add_argument(
        "--cases",
        default="steady,hanging,failing,storm,delete,replicas",
        help="comma-separated, from: steady hanging failing storm delete churn replicas",
    )
    parser.add_argument("--churn-cycles", type=int, default=3, help="for the churn case")
    parser.add_argument("--operator-python", default=sys.executable)
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        type=lambda text: tuple(text.split("=", 1)),
        metavar="NAME=VALUE",
        help="an environment variable for the operator (repeatable), e.g. MALLOC_ARENA_MAX=2",
    )
    parser.add_argument("--work-dir", help="keep logs and the audit log here")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    cases = args.cases.split(",")

    with workdir(args.work_dir) as work:
        policy = work / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        audit = Audit(work / "audit.log")
        plane = ControlPlane(
            bin_dir_from_env(),
            work / "control-plane",
            apiserver_args=[
                f"--audit-policy-file={policy}",
                f"--audit-log-path={audit.path}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
            ],
        )
        with plane:
            bench = Bench(args, work, plane, audit)
            try:
                run(bench, cases)
            finally:
                if args.json:
                    Path(args.json).write_text(json.dumps(bench.results, indent=2) + "\n")


def run(bench: Bench, cases: list[str]) -> None:
    args = bench.args
    namespaces = bench.namespaces("load", args.objects)
    operator = bench.operator("operator", dict(args.operator_env))
    operator.wait_for_log("Started the slotune operator")
    print(f"operator: {args.operator_python}; {args.objects} objects", flush=True)
    time.sleep(5)
    idle = operator.rss_mib()
    created = time.monotonic()
    bench.create(bench.fleet(namespaces))
    bench.wait_converged(namespaces, args.objects, 1800, "creating")
    bench.results["create"] = {
        "objects": args.objects,
        "created_and_reconciled_s": round(time.monotonic() - created, 1),
        "rss_mib_idle": round(idle, 1),
        "rss_mib_created": round(operator.rss_mib(), 1),
    }
    bench.report("create")
    runners: dict[str, Callable[[], None]] = {
        "steady": lambda: bench.steady(operator, namespaces),
        "hanging": lambda: bench.hanging(operator, namespaces),
        "failing": lambda: bench.failing(operator),
        "storm": lambda: bench.storm(operator, namespaces),
        "delete": lambda: bench.delete(operator, namespaces),
        "churn": lambda: bench.churn(operator, namespaces, args.churn_cycles),
    }
    try:
        for case in cases:
            if case in runners:
                runners[case]()
    finally:
        operator.stop()
    if "replicas" in cases:
        if "delete" in cases or "churn" in cases:
            bench.create([llmd(f"o{i}", namespaces[0]) for i in range(20)])
        bench.replicas(namespaces)


if __name__ == "__main__":
    main()
