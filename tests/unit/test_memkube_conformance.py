"""The in-memory API the unit tests run reconciles against behaves like the API server in
what the operator relies on: the same suite runs against the real one in
tests/integration/test_kube_conformance.py."""

from __future__ import annotations

import pytest

from support.kube_conformance import KubeApiConformance
from support.memkube import MemoryApi


class TestMemoryApi(KubeApiConformance):
    @pytest.fixture
    def api(self) -> MemoryApi:
        return MemoryApi()

    @pytest.fixture
    def ns(self) -> str:
        return "conformance"
