"""The local runtime on the real vLLM CPU engine: a healthy start reports its capacity, and a
configuration that cannot start is classified, with its cause, within a bounded time."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

import pytest

from slotune.engine.startup import FailureKind
from slotune.local.process import LocalRuntime, cpu_dtype
from slotune.measure.loadgen import Workload, run_workload
from slotune.metrics import ScrapeSource
from slotune.models import EngineArgs
from slotune.runtime import EngineConfig, EngineStartError
from support.engine import TINY_MODEL, vllm_python

pytestmark = pytest.mark.engine

START_TIMEOUT = 240.0


KV_1GIB = (("VLLM_CPU_KVCACHE_SPACE", "1"),)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> LocalRuntime:
    return LocalRuntime(vllm_python(), tmp_path_factory.mktemp("engines"), dummy_weights=True)


def config(
    extra: tuple[str, ...] = (), env: tuple[tuple[str, str], ...] = KV_1GIB, **args: object
) -> EngineConfig:
    return EngineConfig(
        model=str(TINY_MODEL),
        served_name="tiny",
        args=EngineArgs.model_construct(**{"max_model_len": 1024, **args}),  # type: ignore[arg-type]
        extra_args=extra,
        env=env,
    )


def test_healthy_start_reports_capacity_and_stops_cleanly(runtime: LocalRuntime) -> None:
    engine = runtime.start(config(block_size=128), timeout=START_TIMEOUT)
    try:
        facts = engine.facts
        # 1 GiB of KV for the tiny model: 4 layers x 2 x 4 heads x 32 dims at its dtype here.
        dtype_bytes = 2 if cpu_dtype() == "bfloat16" else 4
        assert facts.kv_cache_tokens == (1 << 30) // (4 * 2 * 4 * 32 * dtype_bytes)
        assert facts.concurrency_request_tokens == 1024
        assert facts.max_concurrency == pytest.approx(facts.kv_cache_tokens / 1024, rel=0.01)
        assert facts.startup_seconds is not None
        assert facts.startup_seconds < START_TIMEOUT
        with urllib.request.urlopen(f"{engine.base_url}/health", timeout=5) as response:  # noqa: S310
            assert response.status == 200
        probes_keep_their_cache_apart_without_dev_mode(engine.base_url)
    finally:
        engine.stop()
    assert engine.process.poll() is not None
    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        urllib.request.urlopen(f"{engine.base_url}/health", timeout=2)  # noqa: S310


def probes_keep_their_cache_apart_without_dev_mode(base_url: str) -> None:
    """A trial engine serves no dev endpoints (the cache reset answers 404), and the capacity
    search's salts keep what one probe cached from the next: the same prompts under another
    salt hit no cached block, and under their own salt again hit every full one."""
    reset = urllib.request.Request(f"{base_url}/reset_prefix_cache", method="POST")  # noqa: S310
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(reset, timeout=10)  # noqa: S310 - the local engine
    assert refused.value.code == 404
    metrics = ScrapeSource(f"{base_url}/metrics", timeout=5.0)

    def hits_after(salt: str) -> float:
        shape = Workload(
            num_requests=4, concurrency=1, prompt_tokens=512, output_tokens=2, seed=3,
            cache_salt=salt,
        )  # fmt: skip
        results = asyncio.run(run_workload(base_url, "tiny", shape))
        assert all(r.ok for r in results), [r.error for r in results]
        return metrics.value("vllm:prefix_cache_hits_total") or 0.0

    first = hits_after("slotune-probe-a")
    other = hits_after("slotune-probe-b")
    again = hits_after("slotune-probe-a")
    assert other - first == 0  # another probe's salt: nothing of the first probe's is hit
    # Its own salt: each 512-token prompt's three full 128-token blocks before its last token.
    assert again - other >= 4 * 3 * 128


@pytest.mark.parametrize(
    ("cfg", "kind", "fragment", "bound"),
    [
        (config(extra=("--swap-space", "4")), FailureKind.INVALID_ARGUMENTS, "--swap-space", 60),
        (config(block_size=24), FailureKind.INVALID_ARGUMENTS, "No common block size for 24", 180),
        (
            # No VLLM_CPU_KVCACHE_SPACE: it would override the flag.
            config(extra=("--kv-cache-memory-bytes", "1M"), env=(), max_model_len=4096),
            FailureKind.KV_CACHE_TOO_SMALL,
            "max seq len (4096)",
            180,
        ),
    ],
    ids=["unknown-flag", "block-size", "kv-too-small"],
)
def test_a_configuration_that_cannot_start_is_classified(
    runtime: LocalRuntime, cfg: EngineConfig, kind: FailureKind, fragment: str, bound: float
) -> None:
    began = time.monotonic()
    with pytest.raises(EngineStartError) as caught:
        runtime.start(cfg, timeout=START_TIMEOUT)
    failure = caught.value.failure
    assert failure.kind == kind, failure
    assert fragment in failure.message
    assert failure.evidence
    assert time.monotonic() - began < bound
