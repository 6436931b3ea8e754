"""The operator against a real control plane: upstream etcd, kube-apiserver (RBAC on) and
kube-controller-manager, built from the pinned Go modules by scripts/build-control-plane.sh.

The operator runs as its own process, under the ServiceAccount and ClusterRole the Helm chart
installs, exactly as it would in a cluster. There are no nodes: pods stay Pending unless a test
plays the kubelet's part for their status.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cluster import Cluster, OperatorProcess
from support.controlplane import ControlPlane, bin_dir_from_env


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bin_dir = bin_dir_from_env()
    plane = ControlPlane(bin_dir, tmp_path_factory.mktemp("control-plane"))
    with plane:
        c = Cluster(plane, bin_dir)
        c.install_crd()
        yield c


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's ServiceAccount and RBAC, installed; a kubeconfig with that SA's token."""
    return cluster.install_operator_rbac(tmp_path_factory.mktemp("operator") / "kubeconfig")


@pytest.fixture(scope="session")
def operator(
    cluster: Cluster, operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(operator_kubeconfig, tmp_path_factory.mktemp("logs") / "operator.log")
    process.start()
    yield process
    process.stop()
    sys.stderr.write(f"\nOperator log: {process.log_path}\n")


_counter = iter(range(1, 10_000))


@pytest.fixture
def namespace(cluster: Cluster) -> str:
    name = f"t{next(_counter)}"
    cluster.kubectl("create", "namespace", name)
    return name
