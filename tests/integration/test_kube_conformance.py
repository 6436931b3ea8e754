"""slotune's Kubernetes clients against the real API server, through the suite the tests'
in-memory API passes too (tests/unit/test_memkube_conformance.py): `Kube`, and `CachedKube`,
the one the operator runs with."""

from __future__ import annotations

import pytest

from slotune.kube import CachedKube, Kube, load_api_client
from support.cluster import Cluster
from support.kube_conformance import KubeApiConformance

pytestmark = pytest.mark.integration


class OnTheApiServer(KubeApiConformance):
    """The suite in a namespace of the test cluster; a subclass names the client."""

    @pytest.fixture
    def ns(self, namespace: str) -> str:
        return namespace


class TestRealApiServer(OnTheApiServer):
    @pytest.fixture
    def api(self, cluster: Cluster) -> Kube:
        return Kube(load_api_client(str(cluster.plane.admin_kubeconfig)))


class TestCachedKube(OnTheApiServer):
    @pytest.fixture
    def api(self, cluster: Cluster) -> CachedKube:
        return CachedKube(load_api_client(str(cluster.plane.admin_kubeconfig)))
