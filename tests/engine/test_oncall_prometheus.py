"""On-call enforcement against the real thing: the vLLM CPU engine scraped every second by a
real Prometheus, read by `read_live` and judged by `evaluate`.

This Prometheus scrapes the engine the way a cluster does: with the `namespace` and `pod`
target labels Kubernetes service discovery adds. There is no GPU here, so the DCGM exporter's
side is its exposition as dcgm-exporter 4.5 writes it (pod mapping on), served as text and
scraped like the exporter in a cluster: with `honorLabels: false`, so the GPU's pod arrives as
`exported_pod`. The requests have the shape test_prometheus_scrape sends (5 prompt tokens, 8
output tokens), so its workload fingerprint stays exact when the whole directory runs.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from tests.support.specs import llm_spec

from slotune.live.oncall import LiveReading, OnCall, evaluate, read_live
from slotune.metrics import PrometheusSource
from slotune.models import LLMDeploymentSpec, LLMDeploymentStatus
from support.engine import SERVED_NAME, ScrapedEngine
from support.prometheus import PrometheusServer, prometheus_binary

pytestmark = pytest.mark.engine

NAMESPACE = "llm"
POD = "tiny-6c5d8f7b9-x2k4q"
OTHER_POD = "other-59b7c6d4f-q8r2m"
PROMPT = [1, 2, 3, 4, 5]
OUTPUT_TOKENS = 8
REQUESTS = 80  # a live verdict needs enough requests for its attainment interval to resolve
EMPTY = LLMDeploymentStatus()


def spec(slo: dict[str, Any], **more: Any) -> LLMDeploymentSpec:
    return llm_spec(model={"name": "tiny", "servedName": SERVED_NAME}, slo=slo, **more)


# TTFT p95 <= 2 s is a bound the shared engine's --custom-histogram-buckets add; TPOT's 1 s is
# one of vLLM's defaults. A 5-token prompt on the tiny model takes milliseconds.
LAX = spec(
    {
        "ttft": {"percentile": 95, "maxSeconds": 2.0},
        "tpot": {"percentile": 95, "maxSeconds": 1.0},
        "window": "1m",
    }
)
# 1 ms to the first token, through HTTP and the scheduler: no engine meets it.
IMPOSSIBLE = spec(
    {"ttft": {"percentile": 95, "maxSeconds": 0.001}, "window": "1m"},
    resources={"gpus": 0},
    tuning={"enabled": True, "retune": {"after": "0s", "cooldown": "1h"}},
)


def _gpu_series(gpu: str, pod: str, *, clock: int, reasons: int, temperature: int) -> str:
    labels = (
        f'gpu="{gpu}",UUID="GPU-5fd4e0c1-0000-0000-0000-00000000000{gpu}",'
        f'pci_bus_id="00000000:1{gpu}:00.0",device="nvidia{gpu}",modelName="NVIDIA H200",'
        f'Hostname="gpu-node-1",DCGM_FI_DRIVER_VERSION="570.133.20",container="vllm",'
        f'namespace="{NAMESPACE}",pod="{pod}"'
    )
    values = {
        "DCGM_FI_DEV_SM_CLOCK": clock,
        "DCGM_FI_DEV_MAX_SM_CLOCK": 1980,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": reasons,
        "DCGM_FI_DEV_FB_USED": 128000,
        "DCGM_FI_DEV_GPU_TEMP": temperature,
    }
    return "".join(f"{name}{{{labels}}} {value}\n" for name, value in values.items())


# GPU 0 serves our pod, slowed by the software thermal limit (0x20); GPU 1, hotter and
# power-braked, belongs to another pod and must not be reported.
DCGM_EXPOSITION = (
    "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n"
    "# TYPE DCGM_FI_DEV_MAX_SM_CLOCK gauge\n"
    "# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge\n"
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
    + _gpu_series("0", POD, clock=1410, reasons=0x20, temperature=87)
    + _gpu_series("1", OTHER_POD, clock=900, reasons=0x80, temperature=93)
)


class _Text(BaseHTTPRequestHandler):
    body = b""
    content_type = "text/plain; version=0.0.4"

    def do_GET(self) -> None:  # the stdlib's name
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(body: str, content_type: str = "text/plain; version=0.0.4") -> ThreadingHTTPServer:
    """An HTTP server on a free port answering every GET with `body`; shut it down after."""
    handler = type("Handler", (_Text,), {"body": body.encode(), "content_type": content_type})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def address(server: ThreadingHTTPServer) -> str:
    return f"127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def dcgm_exporter() -> Iterator[str]:
    server = serve(DCGM_EXPOSITION)
    yield address(server)
    server.shutdown()


def _job(name: str, target: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "job_name": name,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [target], "labels": labels}],
    }


@pytest.fixture(scope="module")
def cluster_prometheus(
    scraped_vllm: ScrapedEngine, dcgm_exporter: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    """Scrapes the engine as its serving pod, and the exporter as a pod of its own."""
    jobs = [
        _job("vllm", scraped_vllm.target, {"namespace": NAMESPACE, "pod": POD}),
        _job(
            "dcgm-exporter",
            dcgm_exporter,
            {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p"},
        ),
    ]
    server = PrometheusServer(
        prometheus_binary(install=True),
        tmp_path_factory.mktemp("prometheus-oncall"),
        [scraped_vllm.target, dcgm_exporter],
        config={"scrape_configs": jobs},
    )
    with server:
        server.wait_for_target_up()
        yield server


@pytest.fixture
def source(cluster_prometheus: PrometheusServer) -> Iterator[PrometheusSource]:
    src = PrometheusSource(cluster_prometheus.url, timeout=5)
    yield src
    src.close()


def live(
    source: PrometheusSource, spec_: LLMDeploymentSpec, served: str = SERVED_NAME
) -> LiveReading:
    return read_live(source, spec_, namespace=NAMESPACE, served_name=served, now=datetime.now(UTC))


def until(read: Callable[[], LiveReading], done: Callable[[LiveReading], bool]) -> LiveReading:
    """Read until Prometheus has scraped what `done` waits for (20 s at most)."""
    deadline = time.monotonic() + 20
    found = read()
    while not done(found) and time.monotonic() < deadline:
        time.sleep(0.5)
        found = read()
    assert done(found), found
    return found


def observed(reading: LiveReading, target: str) -> float:
    buckets = reading.targets[target].buckets
    return buckets[-1][1] if buckets else 0.0


def condition(oncall: OnCall, type_: str) -> tuple[str, str, str]:
    (found,) = [row for row in oncall.conditions if row[0] == type_]
    return found[1], found[2], found[3]


def test_live_slo_is_unknown_without_traffic_then_met_or_violated(
    scraped_vllm: ScrapedEngine, source: PrometheusSource
) -> None:
    # Nothing was sent since this Prometheus started: two scrapes, no increase.
    idle = until(lambda: live(source, LAX), lambda r: bool(r.targets["ttft"].buckets))
    assert idle.available
    assert idle.scraped
    first = evaluate(LAX, EMPTY, idle, idle.at, last_study_started=None)
    assert condition(first, "SLOMet")[:2] == ("Unknown", "NoTraffic")

    for _ in range(REQUESTS):
        scraped_vllm.complete(PROMPT, OUTPUT_TOKENS)
    busy = until(
        lambda: live(source, LAX),
        lambda r: observed(r, "ttft") >= REQUESTS - 0.5 and observed(r, "tpot") >= REQUESTS - 0.5,
    )
    assert busy.targets["tpot"].metric == "vllm:request_time_per_output_token_seconds"
    assert busy.request_rate is not None
    assert busy.request_rate > 0

    met = evaluate(LAX, EMPTY, busy, busy.at, last_study_started=None)
    status, reason, message = condition(met, "SLOMet")
    assert (status, reason) == ("True", "Met"), message
    assert condition(met, "MetricsAvailable")[:2] == ("True", "Available")
    assert met.slo is not None
    assert met.slo.met is True
    assert met.slo.ttft_p95_seconds is not None
    assert met.slo.ttft_p95_seconds < 2.0
    assert {t.name: t.met for t in met.slo.targets} == {"ttft": True, "tpot": True}
    assert all(t.requests is not None and t.requests >= REQUESTS for t in met.slo.targets)
    assert met.hold is False

    strict = live(source, IMPOSSIBLE)
    violated = evaluate(IMPOSSIBLE, EMPTY, strict, strict.at, last_study_started=None)
    status, reason, message = condition(violated, "SLOMet")
    assert (status, reason) == ("False", "Violated"), message
    assert "observations are <= 0.001s" in message
    assert violated.slo is not None
    assert violated.slo.violating_since == strict.at
    assert violated.retune is not None  # retune.after 0s, no study yet
    assert "p95 ttft" in violated.retune
    assert "GPUThrottled" not in [row[0] for row in violated.conditions]  # gpus: 0

    # Another served name in the namespace: Prometheus holds nothing for it.
    unknown = live(source, LAX, served="not-served-here")
    oncall = evaluate(LAX, EMPTY, unknown, unknown.at, last_study_started=None)
    assert condition(oncall, "SLOMet")[:2] == ("Unknown", "NotScraped")


def test_the_serving_pods_gpus_are_read_through_the_dcgm_exporters_pod_labels(
    source: PrometheusSource,
) -> None:
    reading = until(lambda: live(source, LAX), lambda r: bool(r.gpus))
    assert [(g.gpu, g.pod) for g in reading.gpus] == [("0", POD)]  # not the other pod's GPU
    (gpu,) = reading.gpus
    assert (gpu.sm_clock_mhz, gpu.max_sm_clock_mhz, gpu.clock_event_mask) == (1410, 1980, 0x20)
    assert gpu.peak_sm_clock_mhz == 1410
    assert (gpu.memory_used_mib, gpu.temperature_c) == (128000, 87)
    oncall = evaluate(LAX, EMPTY, reading, reading.at, last_study_started=None)
    status, reason, message = condition(oncall, "GPUThrottled")
    assert (status, reason) == ("True", "Thermal")
    assert f"GPU 0 of pod {POD} at 1410 of 1980 MHz" in message
    assert "sw_thermal" in message
    assert oncall.throttled is True
    assert oncall.gpu is not None
    assert oncall.gpu.throttle_reasons == ["sw_thermal"]
    assert oncall.gpu.temperature_c == 87


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_an_unreachable_or_confused_prometheus_holds_everything_still() -> None:
    now = datetime.now(UTC)
    port = free_port()
    down = read_live(
        PrometheusSource(f"http://127.0.0.1:{port}", timeout=2),
        LAX,
        namespace=NAMESPACE,
        served_name=SERVED_NAME,
        now=now,
    )
    assert down.available is False
    assert down.error is not None
    assert f"127.0.0.1:{port}" in down.error
    assert " at 0x" not in down.error  # the same text on every attempt

    met = LLMDeploymentStatus.model_validate(
        {
            "conditions": [
                {
                    "type": "SLOMet",
                    "status": "True",
                    "reason": "Met",
                    "message": "ttft: met",
                    "lastTransitionTime": "2026-11-30T12:00:00Z",
                }
            ],
            "slo": {"met": True, "ttftP95Seconds": 0.05, "measuredAt": "2026-11-30T12:00:00Z"},
        }
    )
    oncall = evaluate(LAX, met, down, now, last_study_started=None)
    assert oncall.hold is True
    assert condition(oncall, "SLOMet") == ("True", "Met", "ttft: met")
    assert condition(oncall, "MetricsAvailable")[:2] == ("False", "QueryFailed")
    assert oncall.slo is not None
    assert oncall.slo.stale is True
    assert oncall.slo.ttft_p95_seconds == 0.05

    # Something answers at the URL, but not like Prometheus: still a reading, never a raise.
    for body, kind in [
        ("<html>login</html>", "text/html"),
        ('{"status": "success"}', "application/json"),
    ]:
        server = serve(body, kind)
        try:
            confused = read_live(
                PrometheusSource(f"http://{address(server)}", timeout=2),
                LAX,
                namespace=NAMESPACE,
                served_name=SERVED_NAME,
                now=now,
            )
        finally:
            server.shutdown()
        assert confused.available is False, body
        assert confused.error is not None
        assert address(server) in confused.error
