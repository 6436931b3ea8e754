"""The real vLLM (CPU) scraped by a real Prometheus, shared by the engine tests of a session.

Engines start through `LocalRuntime`, the same path (and flag rendering) the tuner uses. The
shared engine runs with the `--custom-histogram-buckets` slotune renders for a "TTFT p95 <= 2 s"
SLO, so the tests can check that the bounds reach the exposition and Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slotune.engine.vllm import custom_histogram_buckets
from slotune.local.process import LocalRuntime
from slotune.models import EngineArgs, SloSpec, SloTarget
from slotune.runtime import EngineConfig
from support.engine import SERVED_NAME, TINY_MODEL, ScrapedEngine, vllm_python
from support.prometheus import PrometheusServer, prometheus_binary

ENGINE_SLO = SloSpec(ttft=SloTarget(percentile=95, max_seconds=2.0))
START_TIMEOUT = 300.0

LOADS_OTHER_SHAPES = frozenset({"test_measurement.py", "test_image_trial_load.py"})
"""Modules that load the shared engine with varied prompt and output lengths. They run last:
test_prometheus_scrape checks the shape of *all* traffic the engine saw in the last minute."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    items.sort(key=lambda item: item.path.parent == here and item.path.name in LOADS_OTHER_SHAPES)


@pytest.fixture(scope="session")
def engine_runtime(tmp_path_factory: pytest.TempPathFactory) -> LocalRuntime:
    """Starts engines of the tiny Llama-shaped model with random weights."""
    return LocalRuntime(vllm_python(), tmp_path_factory.mktemp("engines"), dummy_weights=True)


@pytest.fixture(scope="session")
def scraped_vllm(engine_runtime: LocalRuntime) -> Iterator[ScrapedEngine]:
    config = EngineConfig(
        model=str(TINY_MODEL),
        served_name=SERVED_NAME,
        args=EngineArgs(max_model_len=2048),
        extra_args=("--custom-histogram-buckets", custom_histogram_buckets(ENGINE_SLO)),
        env=(("VLLM_CPU_KVCACHE_SPACE", "1"),),
    )
    engine = engine_runtime.start(config, timeout=START_TIMEOUT)
    scraped = ScrapedEngine(engine.process, engine.port, engine.log_path, engine.facts)
    try:
        yield scraped
    finally:
        scraped.stop()


@pytest.fixture(scope="session")
def prometheus(
    scraped_vllm: ScrapedEngine, tmp_path_factory: pytest.TempPathFactory
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
