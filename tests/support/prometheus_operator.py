"""The Prometheus Operator itself (built from its Go module by
scripts/build-prometheus-operator.sh) against the test control plane, so that tests see what
it makes of slotune's PodMonitors and PrometheusRules: the Prometheus configuration it writes
into the Secret `prometheus-<name>` and the rule files it writes into ConfigMaps.

There is no kubelet here, so the Prometheus pods it asks for never run; the configuration and
the rule files are written before any pod starts, and they are what this checks.

    with PrometheusOperator(cluster, work_dir):
        ...  # Prometheus objects get their configuration
"""

from __future__ import annotations

import base64
import gzip
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from support.cluster import ROOT, Cluster, wait_for
from support.procs import free_ports


def operator_binary() -> Path:
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-prometheus-operator.sh")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(built.stdout.strip().splitlines()[-1])


class PrometheusOperator:
    """The operator as a local process with the admin kubeconfig, watching every namespace."""

    def __init__(self, cluster: Cluster, work_dir: Path) -> None:
        self.cluster = cluster
        self.log_path = work_dir / "prometheus-operator.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusOperator:
        (port,) = free_ports(1)
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    str(operator_binary()),
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log-level=debug",
                ],
                env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def configuration(self, namespace: str, prometheus: str, timeout: float = 90) -> dict[str, Any]:
        """The Prometheus configuration the operator wrote for the Prometheus object, once it
        holds a scrape job (the operator writes an empty one first)."""

        def written() -> dict[str, Any] | None:
            secret = self.cluster.get("secret", f"prometheus-{prometheus}", namespace)
            if secret is None or "prometheus.yaml.gz" not in secret.get("data", {}):
                return None
            config: dict[str, Any] = yaml.safe_load(
                gzip.decompress(base64.b64decode(secret["data"]["prometheus.yaml.gz"]))
            )
            return config if config.get("scrape_configs") else None

        return self._wait(
            "the Prometheus Operator to write a scrape configuration", written, timeout
        )

    def rule_files(self, namespace: str, prometheus: str, timeout: float = 90) -> dict[str, Any]:
        """The rule files the operator wrote for the Prometheus object, by file name."""

        def written() -> dict[str, Any] | None:
            found = self.cluster.kubectl(
                "get", "configmaps", "-n", namespace, "-o", "yaml",
                "-l", f"prometheus-name={prometheus}",
            )  # fmt: skip
            files: dict[str, Any] = {}
            for item in yaml.safe_load(found.stdout)["items"]:
                for name, text in item.get("data", {}).items():
                    files[name] = yaml.safe_load(text)
            return files or None

        return self._wait("the Prometheus Operator to write rule files", written, timeout)

    def _wait(
        self, what: str, written: Callable[[], dict[str, Any] | None], timeout: float
    ) -> dict[str, Any]:
        """What `written` returns once it returns something, or the failure with the log."""
        try:
            found: dict[str, Any] = wait_for(what, written, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nOperator log:\n{self.log()[-4000:]}") from None
        return found
