"""The real vLLM (CPU) scraped by a real Prometheus, shared by the engine tests of a session.

The engine runs with the `--custom-histogram-buckets` slotune renders for a "TTFT p95 <= 2 s"
SLO, so the tests can check that the bounds reach the exposition and Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slotune.models import SloSpec, SloTarget
from slotune.slo import custom_histogram_buckets
from support.prometheus import PrometheusServer, prometheus_binary
from support.vllm_proc import VllmProcess, start_vllm

ENGINE_SLO = SloSpec(ttft=SloTarget(percentile=95, max_seconds=2.0))


@pytest.fixture(scope="session")
def scraped_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    work = tmp_path_factory.mktemp("vllm-scraped")
    vllm = start_vllm(work, ["--custom-histogram-buckets", custom_histogram_buckets(ENGINE_SLO)])
    try:
        yield vllm
    finally:
        vllm.stop()


@pytest.fixture(scope="session")
def prometheus(
    scraped_vllm: VllmProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    server = PrometheusServer(
        prometheus_binary(install=True),
        tmp_path_factory.mktemp("prometheus"),
        [scraped_vllm.target],
        job="vllm",
        scrape_interval="1s",
    )
    with server:
        server.wait_for_target_up()
        yield server
