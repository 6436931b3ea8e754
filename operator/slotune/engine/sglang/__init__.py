"""SGLang (`python -m sglang.launch_server`): its flags for slotune's typed settings, the
metrics it exposes with `--enable-metrics`, its histogram-bucket flags and its health path; its
flag rules, against the table dumped from its parser, are in `rules`.

Facts from SGLang's `ServerArgs` and `srt/metrics/collector.py` (0.5): the chunked-prefill
budget is `--chunked-prefill-size`, the running-batch cap `--max-running-requests`, the KV page
`--page-size`, the static memory fraction `--mem-fraction-static`; prefix caching (the radix
cache) is on unless `--disable-radix-cache`. It exposes no per-request TPOT histogram, so a TPOT
target cannot be judged live on SGLang (its ITL histogram can).

Not yet covered for SGLang: start-up log patterns captured from its real failures (those here
are its messages as its source words them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from slotune.engine.base import Violation, bounds_around
from slotune.engine.knobs import render_knobs
from slotune.engine.sglang import rules
from slotune.engine.sglang.rules import KNOBS
from slotune.engine.startup import Cause, FailureKind, StartFailure, StartupFacts, classify
from slotune.models import AttentionBackend, EngineArgs, SloSpec

METRICS: Mapping[str, tuple[str, ...]] = {
    "ttft": ("sglang:time_to_first_token_seconds",),
    "itl": ("sglang:inter_token_latency_seconds",),
    "e2e": ("sglang:e2e_request_latency_seconds",),
    "request_success": ("sglang:num_requests_total",),
    "prompt_tokens": ("sglang:prompt_tokens_total",),
    "generation_tokens": ("sglang:generation_tokens_total",),
    "requests_running": ("sglang:num_running_reqs",),
    "requests_waiting": ("sglang:num_queue_reqs",),
    "kv_cache_usage": ("sglang:token_usage",),
}

# SGLang's default bounds (srt/metrics/collector.py, TokenizerMetricsCollector).
DEFAULT_BUCKETS: Mapping[str, tuple[float, ...]] = {
    "ttft": (
        0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
        200.0, 400.0,
    ),
    "itl": (
        0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
        0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0,
    ),
    "e2e": (
        0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
        200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
    ),
}  # fmt: skip

# The flag that sets each histogram's bounds (nargs "+", seconds).
BUCKET_FLAGS: Mapping[str, str] = {
    "ttft": "--bucket-time-to-first-token",
    "itl": "--bucket-inter-token-latency",
    "e2e": "--bucket-e2e-request-latency",
}

_KV_TOKENS = re.compile(r"max_total_num_tokens=(\d+)")

CAUSES: tuple[Cause, ...] = (
    Cause(
        FailureKind.INVALID_ARGUMENTS,
        (r"error: unrecognized arguments: .*", r"error: argument .*"),
        "SGLang's argument parser refused the flags",
    ),
    Cause(
        FailureKind.OUT_OF_MEMORY,
        (r"Not enough memory", r"CUDA out of memory", r"OutOfMemoryError", r"MemoryError"),
        "the engine ran out of memory while starting",
    ),
    Cause(
        FailureKind.INVALID_ARGUMENTS,
        (r"ValueError: .*", r"AssertionError: .*"),
        "SGLang rejected the configuration",
    ),
)


def _flag_of(token: str) -> str:
    return token.split("=", 1)[0]


class Sglang:
    """SGLang's HTTP server."""

    kind = "sglang"
    title = "SGLang"
    container_name = "sglang"
    module = "sglang.launch_server"
    command = ("python3", "-m", module)
    port = 30000
    health_path = "/health"
    api_key_env = "SGLANG_API_KEY"
    api_key_args = ("--api-key", "$(SGLANG_API_KEY)")
    salts_prefix_cache = False  # SGLang's requests take no salt
    cache_reset_path: str | None = "/flush_cache"  # served without any further setting
    # SGLang's own JIT caches (DeepGEMM's among them) live under SGLANG_CACHE_DIR
    # (srt/environ.py, default ~/.cache/sglang); torch.compile's under Inductor's and Triton's.
    cache_dirs: Mapping[str, str] = {
        "SGLANG_CACHE_DIR": "sglang",
        "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
        "TRITON_CACHE_DIR": "triton",
    }
    model_label = "model_name"
    knobs = KNOBS
    flag_table_versions: tuple[str, ...] = rules.TABLES.supported_versions()
    metrics = METRICS
    default_buckets = DEFAULT_BUCKETS

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
        rendered = ["--model-path", model, "--served-model-name", served_name, "--host", host]
        rendered += ["--port", str(self.port if port is None else port)]
        if tensor_parallel_size > 1:
            rendered += ["--tp-size", str(tensor_parallel_size)]
        # Without it SGLang serves no /metrics, and slotune could not see the SLO.
        rendered.append("--enable-metrics")
        return rendered + render_knobs(KNOBS, args.explicit()) + list(extra_args)

    def tracing_args(self, endpoint: str) -> list[str]:
        # SGLang traces only when asked to (`--enable-trace`); not yet run against an image.
        return ["--enable-trace", "--otlp-traces-endpoint", endpoint]

    def observability_args(self, slo: SloSpec, image: str, extra_args: list[str]) -> list[str]:
        given = {_flag_of(token) for token in extra_args}
        thresholds: dict[str, list[float]] = {}
        for name, target in slo.targets().items():
            if name in BUCKET_FLAGS and BUCKET_FLAGS[name] not in given:
                thresholds.setdefault(name, []).append(target.max_seconds)
        rendered: list[str] = []
        for name, values in sorted(thresholds.items()):
            bounds = bounds_around(DEFAULT_BUCKETS[name], values)
            rendered += [BUCKET_FLAGS[name], *(f"{b:g}" for b in bounds)]
        return rendered

    def check_config(
        self,
        args: EngineArgs,
        extra_args: list[str],
        backend: AttentionBackend,
        image: str,
        *,
        version: str | None = None,
    ) -> list[Violation]:
        problems = []
        taken = {knob.field for knob in KNOBS}
        for field in sorted(set(args.explicit()) - taken):
            problems.append(
                Violation(
                    f"spec.engine.args.{field}",
                    "SGLang has no such setting in slotune; remove it, or pass SGLang's own "
                    "flag in spec.engine.extraArgs",
                )
            )
        # A version given is one of the tables'; an image's may have none (then the nearest).
        exact = version is not None or rules.TABLES.exact_table(image)
        version = version or rules.TABLES.version_of_image(image)
        return problems + rules.check_extra_args(extra_args, version, exact=exact)

    def check_resources(
        self, extra_args: list[str], gpus: int, image: str, backend: AttentionBackend | None
    ) -> list[Violation]:
        return rules.check_resources(extra_args, gpus, rules.TABLES.version_of_image(image))

    def backend_accepts(self, field: str, value: object, backend: str) -> bool:
        return True

    def kv_cache_dtype_hint(self, value: str) -> str:
        return "SGLang's KV-cache dtype is not a typed setting; pass --kv-cache-dtype in extraArgs"

    def image_note(self, image: str) -> str:
        return rules.TABLES.flag_table_note(image)

    def parse_startup(self, log: str) -> StartupFacts:
        kv = _KV_TOKENS.findall(log)
        return StartupFacts(kv_cache_tokens=int(kv[-1]) if kv else None)

    def classify_failure(
        self, log: str, *, exit_code: int | None, timed_out: bool, seconds: float | None = None
    ) -> StartFailure:
        return classify(log, CAUSES, exit_code=exit_code, timed_out=timed_out, seconds=seconds)


ENGINE = Sglang()
