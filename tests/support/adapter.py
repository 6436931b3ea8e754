"""prometheus-adapter serving the external metrics API, so that the real kube-controller-manager's
HPA controller scales on Prometheus series (slotune's `slotune_llmdeployment_replicas_needed`).

The binary comes from its Go module (scripts/build-prometheus-adapter.sh). It runs as a local
process on one of the host's own addresses (the API server refuses loopback endpoints), behind
a Service without a selector and its Endpoints, and the APIService
`v1beta1.external.metrics.k8s.io` points the aggregation layer there (the test API server
routes to the endpoints, there being no kube-proxy; support.controlplane sets up the front
proxy). It authenticates and authorizes callers through the API server with the admin
kubeconfig.

    with MetricsAdapter(cluster, work_dir, prometheus.url, EXTERNAL_RULES) as adapter:
        ...  # HPAs with External metrics work
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from support.cluster import ROOT, Cluster, wait_for
from support.procs import free_ports

NAMESPACE = "monitoring"
NAME = "prometheus-adapter"

EXTERNAL_RULES: dict[str, Any] = {
    "externalRules": [
        {
            "seriesQuery": "slotune_llmdeployment_replicas_needed",
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "name": {"as": "slotune_replicas_needed"},
            "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (name)",
        }
    ]
}
"""The README's rule: the replicas each LLMDeployment's demand needs, by its name."""


def adapter_binary() -> Path:
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-prometheus-adapter.sh")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(built.stdout.strip().splitlines()[-1])


def host_address() -> str:
    """One of the host's own IPv4 addresses that is not loopback."""
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in shown.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    raise RuntimeError("the host has no non-loopback IPv4 address for the adapter to serve on")


class MetricsAdapter:
    def __init__(
        self, cluster: Cluster, work_dir: Path, prometheus_url: str, rules: dict[str, Any]
    ) -> None:
        self.cluster, self.work_dir = cluster, work_dir
        self.prometheus_url, self.rules = prometheus_url, rules
        self.address = host_address()
        (self.port,) = free_ports(1)
        self.process: subprocess.Popen[bytes] | None = None
        self.log = work_dir / "adapter.log"

    def __enter__(self) -> MetricsAdapter:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "adapter-config.yaml"
        config.write_text(yaml.safe_dump(self.rules))
        admin = str(self.cluster.kubeconfig)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    str(adapter_binary()),
                    f"--secure-port={self.port}",
                    f"--bind-address={self.address}",
                    f"--cert-dir={self.work_dir / 'adapter-certs'}",
                    f"--lister-kubeconfig={admin}",
                    f"--authentication-kubeconfig={admin}",
                    f"--authorization-kubeconfig={admin}",
                    f"--prometheus-url={self.prometheus_url}",
                    f"--config={config}",
                    "--metrics-relist-interval=5s",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        self.cluster.apply(self._objects())
        wait_for("the external metrics API", self._served, 90)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.kubectl(
            "delete", "apiservice", "v1beta1.external.metrics.k8s.io", "--wait=false", check=False
        )
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def _objects(self) -> str:
        service = {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"ports": [{"port": 443, "targetPort": self.port}]},
        }  # fmt: skip
        endpoints = {
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "subsets": [{"addresses": [{"ip": self.address}], "ports": [{"port": self.port}]}],
        }  # fmt: skip
        api_service = {
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
            "spec": {
                "group": "external.metrics.k8s.io", "version": "v1beta1",
                "service": {"name": NAME, "namespace": NAMESPACE, "port": 443},
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 100, "versionPriority": 100,
            },
        }  # fmt: skip
        return yaml.safe_dump_all([service, endpoints, api_service])

    def _served(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the adapter exited: {self.log.read_text()[-2000:]}")
        answer = self.cluster.kubectl(
            "get", "--raw", "/apis/external.metrics.k8s.io/v1beta1", check=False
        )
        return answer.returncode == 0

    def value(self, namespace: str, metric: str, selector: str) -> float | None:
        """What the HPA controller reads: the metric's values for `selector`, summed."""
        path = (
            f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}"
            f"?labelSelector={selector}"
        )
        answer = self.cluster.kubectl("get", "--raw", path, check=False)
        if answer.returncode != 0:
            return None
        items = json.loads(answer.stdout).get("items") or []
        if not items:
            return None
        return sum(_quantity(item["value"]) for item in items)


def _quantity(text: str) -> float:
    """A Kubernetes quantity as the metrics API writes it: `2`, `2500m`."""
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    return float(text)
