"""Helpers for tests against the real control plane: kubectl/helm wrappers, polling, and the
operator as a separate process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.controlplane import ControlPlane
from support.kubelet import Kubelet

ROOT = Path(__file__).resolve().parents[2]
# The operator re-reconciles every object this often in tests (30 s in production).
RESYNC_SECONDS = 3
OPERATOR_NAMESPACE = "slotune-system"
SERVICE_ACCOUNT = "slotune"


@dataclass
class Cluster:
    """kubectl and helm against the test control plane, as the admin."""

    plane: ControlPlane
    bin_dir: Path

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        obj: dict[str, Any] = json.loads(result.stdout)
        return obj

    def apply(self, obj: dict[str, Any] | str, *extra: str) -> subprocess.CompletedProcess[str]:
        # JSON, not YAML: PyYAML leaves a string such as a config hash "123e4567" unquoted,
        # and kubectl's YAML reads it back as a number.
        text = obj if isinstance(obj, str) else json.dumps(obj)
        return self.kubectl("apply", "-f", "-", *extra, input=text, check=False)

    def install_crd(self) -> None:
        """Applies crds/ and waits until the API server serves LLMDeployments."""
        self.install_crds([ROOT / "crds"], ["llmdeployments.slotune.dev"])

    def install_crds(self, paths: list[Path], names: list[str]) -> None:
        """Applies CRD files (or folders of them) server-side and waits until each CRD named
        (`<plural>.<group>`) is established."""
        for path in paths:
            self.kubectl("apply", "--server-side", "-f", str(path))
        # Polled rather than `kubectl wait`, which fails outright ("accessor error") when it
        # reads the CRD before the server has given it any condition.
        established = "{.status.conditions[?(@.type=='Established')].status}"
        for name in names:
            wait_for(
                f"the CRD {name} to be established",
                lambda name=name: self.kubectl(
                    "get", f"crd/{name}", "-o", f"jsonpath={established}", check=False,
                ).stdout.strip() == "True",
                timeout=60,
            )  # fmt: skip

    def install_operator_rbac(self, kubeconfig: Path) -> Path:
        """Applies the chart's ServiceAccount, ClusterRole and binding; writes a kubeconfig
        that carries that ServiceAccount's token, for running the operator as it would run
        in a cluster."""
        rendered = self.helm(
            "template", "slotune", str(ROOT / "charts" / "slotune"),
            "--namespace", OPERATOR_NAMESPACE,
            "--show-only", "templates/serviceaccount.yaml",
            "--show-only", "templates/clusterrole.yaml",
            "--show-only", "templates/clusterrolebinding.yaml",
            "--show-only", "templates/role.yaml",
            "--show-only", "templates/rolebinding.yaml",
        )  # fmt: skip
        self.kubectl("create", "namespace", OPERATOR_NAMESPACE)
        result = self.apply(rendered)
        if result.returncode != 0:
            raise AssertionError(f"installing the chart's RBAC failed:\n{result.stderr}")
        token = self.kubectl(
            "create", "token", SERVICE_ACCOUNT, "-n", OPERATOR_NAMESPACE, "--duration=4h"
        ).stdout.strip()
        return self.plane.kubeconfig_for_token(token, kubeconfig)

    def helm(self, *args: str) -> str:
        result = subprocess.run(
            [str(self.bin_dir / "helm"), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float = 45.0, interval: float = 0.5
) -> Any:
    """Polls until probe returns something truthy; fails with the description otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last saw {last!r}")


class OperatorProcess:
    """`slotune operator` as a separate process, under the chart's ServiceAccount: this
    checkout's, or the command `argv` gives (the operator image under podman)."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        env: dict[str, str] | None = None,
        argv: list[str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.env = env or {}
        self.argv = argv or [
            sys.executable, "-m", "slotune.cli", "operator", f"--kubeconfig={kubeconfig}",
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ready: str = "Started the slotune operator") -> None:
        """Starts it and waits for the log line `ready` (a standby logs "Standing by")."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "SLOTUNE_RESYNC_SECONDS": str(RESYNC_SECONDS),
                **self.env,
            },
        )
        try:
            wait_for(
                f"the operator to log {ready!r}",
                lambda: ready in self.log() or self.dead(),
            )
        except AssertionError:
            self.stop()  # never leave an operator behind a failed start
            raise
        assert not self.dead(), self.log()

    def dead(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, like a node failure or an OOM kill."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class OperatorPod:
    """The operator as `helm install` of the chart runs it: the chart's Deployment, whose pod
    the test kubelet runs as a container of the operator image (podman, runc) under the
    release's own ServiceAccount and RBAC, reaching the API server through the token and CA
    that the kubelet projects into it. `kill()` SIGKILLs the container and `start()` waits
    until the Deployment's restart policy has the operator watching again."""

    CONTAINER = "operator"
    STARTED = "Started the slotune operator"

    def __init__(
        self,
        cluster: Cluster,
        kubelet: Kubelet,
        work_dir: Path,
        *,
        release: str,
        namespace: str,
        values: dict[str, Any],
    ) -> None:
        self.cluster, self.kubelet = cluster, kubelet
        self.release, self.namespace = release, namespace
        self.values_file = work_dir / f"{release}-values.yaml"
        self.values_file.write_text(yaml.safe_dump(values))
        self._starts = 0

    def install(self) -> None:
        self.cluster.helm(
            "install", self.release, str(ROOT / "charts" / "slotune"),
            "--namespace", self.namespace, "--create-namespace",
            "--values", str(self.values_file), "--kubeconfig", str(self.cluster.kubeconfig),
        )  # fmt: skip
        self.start()

    def uninstall(self) -> None:
        self.cluster.helm(
            "uninstall", self.release, "--namespace", self.namespace, "--wait",
            "--kubeconfig", str(self.cluster.kubeconfig),
        )  # fmt: skip
        wait_for("the operator's pod to go", lambda: self.pod() is None, 60)

    def pod(self) -> str | None:
        """The name of the release's operator pod that is not being deleted."""
        pods = json.loads(
            self.cluster.kubectl(
                "get", "pods", "-n", self.namespace, "-o", "json",
                "-l", f"app.kubernetes.io/instance={self.release}",
            ).stdout
        )["items"]  # fmt: skip
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return live[0]["metadata"]["name"] if live else None

    def log(self) -> str:
        """Every start's output of the container, in order (the kubelet appends them)."""
        name = self.pod()
        return self.kubelet.logs(self.namespace, name, self.CONTAINER) if name else ""

    def kill(self) -> None:
        """SIGKILL to the operator in its container: no chance to clean up, as an OOM kill."""
        name = self.pod()
        assert name is not None, "no operator pod"
        self.kubelet.kill_container(self.namespace, name, self.CONTAINER)

    def start(self) -> None:
        """Waits until the operator has started once more than before (the first start after
        install, or the restart after a kill)."""
        wait_for(
            "the operator's container to start watching",
            lambda: self.log().count(self.STARTED) > self._starts,
            90,
        )
        self._starts = self.log().count(self.STARTED)


def llmd(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A small valid LLMDeployment, with spec fields overridden."""
    body: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": name},
        "engine": {
            "image": "vllm/vllm-openai:v0.32.0",
            "args": {"maxNumBatchedTokens": 2048, "blockSize": 16, "maxNumSeqs": 64},
        },
        "resources": {"gpus": 1},
        "slo": {"ttft": {"percentile": 95, "maxSeconds": 2.0}},
    }
    body.update(spec)
    return {
        "apiVersion": "slotune.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }
