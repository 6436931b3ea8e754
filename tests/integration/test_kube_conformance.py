"""slotune's Kubernetes client against the real API server, through the suite the tests'
in-memory API passes too (tests/unit/test_memkube_conformance.py)."""

from __future__ import annotations

import pytest

from slotune.kube import Kube, load_api_client
from support.cluster import Cluster
from support.kube_conformance import KubeApiConformance

pytestmark = pytest.mark.integration


class TestRealApiServer(KubeApiConformance):
    @pytest.fixture
    def api(self, cluster: Cluster) -> Kube:
        return Kube(load_api_client(str(cluster.plane.admin_kubeconfig)))

    @pytest.fixture
    def ns(self, namespace: str) -> str:
        return namespace
