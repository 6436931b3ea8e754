"""vLLM, the engine slotune was built on: how it is started and probed, the metrics it exposes,
its default histogram bounds, and (in `rules` and `startup`) its flags, their rules and its
start-up log.

Facts are checked against vLLM's source for the pinned version (reference/vllm.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from slotune.engine.base import THRESHOLD_FACTORS, MetricKind, Violation, bounds_around
from slotune.engine.knobs import Knob
from slotune.engine.startup import StartFailure, StartupFacts
from slotune.engine.vllm import rules, startup, tables
from slotune.models import AttentionBackend, EngineArgs, SloSpec

# Every vLLM series slotune reads: signal → (kind, the names it has had, newest first).
# Counters are named with their `_total` suffix; histograms by their base name.
SERIES: Mapping[str, tuple[MetricKind, tuple[str, ...]]] = {
    # latency histograms (seconds)
    "ttft": ("histogram", ("vllm:time_to_first_token_seconds",)),
    # The older name was hidden in 0.32 and is gone from 0.33 (vllm.md §3).
    "tpot": (
        "histogram",
        ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"),
    ),
    "itl": ("histogram", ("vllm:inter_token_latency_seconds",)),
    "e2e": ("histogram", ("vllm:e2e_request_latency_seconds",)),
    "queue_time": ("histogram", ("vllm:request_queue_time_seconds",)),
    "prefill_time": ("histogram", ("vllm:request_prefill_time_seconds",)),
    "decode_time": ("histogram", ("vllm:request_decode_time_seconds",)),
    # token-count histograms: the workload's shape
    "request_prompt_tokens": ("histogram", ("vllm:request_prompt_tokens",)),
    "request_generation_tokens": ("histogram", ("vllm:request_generation_tokens",)),
    # counters
    "request_success": ("counter", ("vllm:request_success_total",)),
    "prompt_tokens": ("counter", ("vllm:prompt_tokens_total",)),
    "generation_tokens": ("counter", ("vllm:generation_tokens_total",)),
    "preemptions": ("counter", ("vllm:num_preemptions_total",)),
    "prefix_cache_hits": (
        "counter",
        ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    ),
    "prefix_cache_queries": (
        "counter",
        ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    ),
    "admission_rejections": ("counter", ("vllm:admission_rejections_total",)),
    # speculative decoding (vllm/v1/spec_decode/metrics.py): proposed and accepted draft tokens
    "spec_decode_drafted": ("counter", ("vllm:spec_decode_num_draft_tokens_total",)),
    "spec_decode_accepted": ("counter", ("vllm:spec_decode_num_accepted_tokens_total",)),
    # gauges
    "kv_cache_usage": ("gauge", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "requests_running": ("gauge", ("vllm:num_requests_running",)),
    "requests_waiting": ("gauge", ("vllm:num_requests_waiting",)),
    "cache_config": ("info", ("vllm:cache_config_info",)),
}

# vLLM's default bounds (vllm/v1/metrics/buckets.py, 0.32 and 0.33), by bucket family.
DEFAULT_BUCKETS: Mapping[str, tuple[float, ...]] = {
    "time_to_first_token": (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ),
    "inter_token_latency": (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0,
    ),
    "request_latency": (
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
    ),
}  # fmt: skip

# The bucket family each SLO metric's histogram has; TPOT and ITL share one.
TARGET_FAMILY: Mapping[str, str] = {
    "ttft": "time_to_first_token",
    "tpot": "inter_token_latency",
    "itl": "inter_token_latency",
    "e2e": "request_latency",
}

HISTOGRAM_FLAG = "--custom-histogram-buckets"


def histogram_bounds(
    slo: SloSpec, factors: Sequence[float] = THRESHOLD_FACTORS
) -> dict[str, list[float]]:
    """Per family touched by a target: vLLM's default bounds plus bounds around each of its
    thresholds. Families without a target are left out, so vLLM keeps its defaults for them."""
    thresholds: dict[str, list[float]] = {}
    for name, target in slo.targets().items():
        thresholds.setdefault(TARGET_FAMILY[name], []).append(target.max_seconds)
    return {
        family: bounds_around(DEFAULT_BUCKETS[family], values, factors)
        for family, values in sorted(thresholds.items())
    }


def custom_histogram_buckets(slo: SloSpec, factors: Sequence[float] = THRESHOLD_FACTORS) -> str:
    """The value of vLLM's `--custom-histogram-buckets` for this SLO: a JSON object from
    bucket family to strictly increasing positive bounds, which replace that family's
    defaults (`ObservabilityConfig.custom_histogram_buckets`)."""
    return json.dumps(histogram_bounds(slo, factors), separators=(",", ":"), sort_keys=True)


class Vllm:
    """vLLM's OpenAI-compatible server."""

    kind = "vllm"
    title = "vLLM"
    container_name = "vllm"
    module = "vllm.entrypoints.openai.api_server"
    command = ("python3", "-m", module)
    port = rules.DEFAULT_PORT
    health_path = "/health"
    api_key_env = rules.API_KEY_VAR
    api_key_args: tuple[str, ...] = ()  # vLLM reads the variable itself
    # Each probe's requests carry a salt of their own (`cache_salt`, vllm/v1/core/
    # kv_cache_utils.py mixes it into the first block's hash): the reset endpoint would need
    # VLLM_SERVER_DEV_MODE on trial pods, which also serves /sleep and /collective_rpc.
    salts_prefix_cache = True
    cache_reset_path: str | None = None
    # Each default is off the cache mount or follows HOME: vLLM's is ~/.cache/vllm (envs.py),
    # Inductor's /tmp/torchinductor_<user>, Triton's ~/.triton/cache. Where vLLM moves
    # Inductor's under its own root to compile (compiler_interface.py, decorators.py), that
    # is on the volume too.
    cache_dirs: Mapping[str, str] = {
        "VLLM_CACHE_ROOT": "vllm",
        "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
        "TRITON_CACHE_DIR": "triton",
    }
    model_label = "model_name"
    knobs: tuple[Knob, ...] = rules.KNOBS
    flag_table_versions: tuple[str, ...] = tables.supported_versions()
    metrics: Mapping[str, tuple[str, ...]] = {name: names for name, (_, names) in SERIES.items()}
    default_buckets: Mapping[str, tuple[float, ...]] = {
        name: DEFAULT_BUCKETS[family] for name, family in TARGET_FAMILY.items()
    }

    def serve_args(
        self,
        model: str,
        served_name: str,
        args: EngineArgs,
        extra_args: list[str],
        *,
        tensor_parallel_size: int = 1,
        host: str = "0.0.0.0",  # noqa: S104 - in a pod the engine serves the pod's network
        port: int | None = None,
    ) -> list[str]:
        """The whole argument list after `python -m vllm.entrypoints.openai.api_server`."""
        rendered = ["--model", model, "--served-model-name", served_name, "--host", host]
        rendered += ["--port", str(self.port if port is None else port)]
        if tensor_parallel_size > 1:
            rendered += ["--tensor-parallel-size", str(tensor_parallel_size)]
        return rendered + rules.render_tuned_args(args) + list(extra_args)

    def tracing_args(self, endpoint: str) -> list[str]:
        return ["--otlp-traces-endpoint", endpoint]

    def observability_args(self, slo: SloSpec, image: str, extra_args: list[str]) -> list[str]:
        # vLLM's default latency buckets cannot decide most SLOs (none between 1 s and 2.5 s
        # for TTFT); the flag exists from 0.32 on.
        known = tables.known_flags(tables.version_of_image(image))
        if HISTOGRAM_FLAG not in known or HISTOGRAM_FLAG in extra_args:
            return []
        return [HISTOGRAM_FLAG, custom_histogram_buckets(slo)]

    def check_config(
        self,
        args: EngineArgs,
        extra_args: list[str],
        backend: AttentionBackend,
        image: str,
        *,
        version: str | None = None,
    ) -> list[Violation]:
        # A version given is one of the tables'; an image's may have none (then the nearest).
        exact = version is not None or tables.exact_table(image)
        version = version or tables.version_of_image(image)
        return rules.check_config(args, extra_args, backend, version, exact=exact)

    def check_resources(
        self, extra_args: list[str], gpus: int, image: str, backend: AttentionBackend | None
    ) -> list[Violation]:
        return rules.check_resources(extra_args, gpus, image, backend)

    def backend_accepts(self, field: str, value: object, backend: str) -> bool:
        return rules.backend_accepts(field, value, backend)

    def kv_cache_dtype_hint(self, value: str) -> str:
        return rules.kv_cache_dtype_hint(value)

    def image_note(self, image: str) -> str:
        return tables.flag_table_note(image)

    def parse_startup(self, log: str) -> StartupFacts:
        return startup.parse_startup(log)

    def classify_failure(
        self, log: str, *, exit_code: int | None, timed_out: bool, seconds: float | None = None
    ) -> StartFailure:
        return startup.classify_failure(
            log, exit_code=exit_code, timed_out=timed_out, seconds=seconds
        )


ENGINE = Vllm()
