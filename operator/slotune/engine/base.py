"""The seam between slotune and an inference engine: what the rest of slotune may ask of one.

Each engine is an adapter in its own package (`slotune.engine.vllm`, `slotune.engine.sglang`)
that holds every fact slotune knows of it: how it is started and probed, which typed settings
it takes and how they are spelled, the rules its configurations must pass, the names of the
metrics it exposes, its default histogram bounds, and what its start-up log says. The one
dispatch is `slotune.engine.engine_for(spec.engine.kind)`. Two modules outside `engine/` still
import `engine.vllm`: `metrics` builds its registry of series from vLLM's names (its default;
the operator's live queries name the deployment's engine's series, `metrics.names_for`), and
`local.process` starts vLLM processes only (`tune --local`); the seam's open debt.

Pure: plain data and functions of plain data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from slotune.engine.knobs import Knob
from slotune.engine.startup import StartFailure, StartupFacts
from slotune.models import AttentionBackend, EngineArgs, SloSpec


@dataclass(frozen=True)
class Violation:
    """A rule a configuration breaks, with the spec field to fix."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


MetricKind = Literal["counter", "gauge", "histogram", "info"]

# The signals an engine adapter names in `Engine.metrics`. The SLO metrics' latency histograms
# (`ttft`, `tpot`, `itl`, `e2e`) are read by on-call; the counters and gauges by the capacity
# search and by on-call's "is this model scraped" check. An engine that has no series for a
# signal leaves it out, and what needs it says so (SGLang has no per-request TPOT histogram).
ENGINE_SIGNALS: tuple[str, ...] = (
    "ttft",
    "tpot",
    "itl",
    "e2e",
    "request_success",
    "prompt_tokens",
    "generation_tokens",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
)


class Engine(Protocol):
    """An inference engine as slotune drives it."""

    @property
    def kind(self) -> str:
        """The value of `spec.engine.kind` that selects this engine."""

    @property
    def title(self) -> str:
        """The engine's name in messages (`vLLM`)."""

    @property
    def container_name(self) -> str: ...

    @property
    def command(self) -> tuple[str, ...]:
        """The container's command; `serve_args` follow it."""

    @property
    def module(self) -> str:
        """The module a local process runs (`python -m <module>`)."""

    @property
    def port(self) -> int: ...

    @property
    def health_path(self) -> str:
        """The path that answers 200 once the engine serves."""

    @property
    def api_key_env(self) -> str:
        """The variable the API key (from `spec.engine.apiKeySecretRef`) is passed in."""

    @property
    def api_key_args(self) -> tuple[str, ...]:
        """Arguments that hand the engine the key from `api_key_env`, where it reads none
        itself (Kubernetes expands `$(VAR)` in a container's args)."""

    @property
    def salts_prefix_cache(self) -> bool:
        """Whether requests may carry a `cache_salt` that keeps their cached prefix blocks
        apart from other salts'. The capacity search gives each probe a salt of its own, so
        that no probe hits blocks an earlier one left."""

    @property
    def cache_reset_path(self) -> str | None:
        """Where the engine cannot salt: the POST that empties its prefix cache, which the
        capacity search calls between probes. It must be served to the trial's load Job
        without a setting that opens more than that (vLLM's reset needs its dev mode, which
        also serves /sleep and /collective_rpc; vLLM salts instead)."""

    @property
    def cache_dirs(self) -> Mapping[str, str]:
        """The variables that place the caches the engine's stack writes (its compile caches,
        Inductor's, Triton's), each with its folder on the cache volume. Set where
        `spec.cache` names a volume the pods share, so a start loads what another compiled;
        their defaults lie outside the cache mount, or follow `HOME`."""

    @property
    def model_label(self) -> str:
        """The label its metrics carry the served model name in."""

    @property
    def knobs(self) -> tuple[Knob, ...]:
        """The typed settings it takes, in the order they render."""

    @property
    def metrics(self) -> Mapping[str, tuple[str, ...]]:
        """For each signal of `ENGINE_SIGNALS` it exposes: the names it has had, newest first
        (counters with their `_total`, histograms by their base name)."""

    @property
    def default_buckets(self) -> Mapping[str, tuple[float, ...]]:
        """For each SLO metric with a latency histogram: the engine's default bucket bounds."""

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
        """The whole argument list after `command`."""

    def tracing_args(self, endpoint: str) -> list[str]:
        """Flags that send a span per request to an OpenTelemetry collector at `endpoint`."""

    def observability_args(self, slo: SloSpec, image: str, extra_args: list[str]) -> list[str]:
        """Flags that add bucket bounds around the SLO's thresholds, so Prometheus can judge
        the live SLO; empty where the image's engine has no such flag or the user set it."""

    @property
    def flag_table_versions(self) -> tuple[str, ...]:
        """The engine versions slotune has a flag table of, oldest first (none: its flags are
        not checked against a parser's)."""

    def check_config(
        self,
        args: EngineArgs,
        extra_args: list[str],
        backend: AttentionBackend,
        image: str,
        *,
        version: str | None = None,
    ) -> list[Violation]:
        """Every rule of the engine's a configuration breaks, checked before it is launched:
        against the image's engine version, or `version` (one of `flag_table_versions`: what
        moving the configuration to that version breaks)."""

    def check_resources(
        self, extra_args: list[str], gpus: int, image: str, backend: AttentionBackend | None
    ) -> list[Violation]:
        """The configuration against the pod's GPUs."""

    def backend_accepts(self, field: str, value: object, backend: str) -> bool:
        """Whether an attention backend runs a knob's value (a block size, a KV dtype)."""

    def kv_cache_dtype_hint(self, value: str) -> str:
        """For a KV-cache dtype the engine does not know: the nearest ones it does."""

    def image_note(self, image: str) -> str:
        """A warning about what an image was checked against; empty when it was exact."""

    def parse_startup(self, log: str) -> StartupFacts:
        """The capacity figures of a start-up log."""

    def classify_failure(
        self, log: str, *, exit_code: int | None, timed_out: bool, seconds: float | None = None
    ) -> StartFailure:
        """Why a start failed, from its log and how the process ended."""


# Bounds added around each SLO threshold, as fractions of it: the threshold itself, and close
# enough on either side that a percentile near it is decided by Prometheus's histogram.
THRESHOLD_FACTORS: tuple[float, ...] = (0.8, 0.9, 1.0, 1.1, 1.25)


def _round_bound(value: float) -> float:
    """Six significant digits, so 0.1 x 1.1 is 0.11 and not 0.11000000000000001."""
    return float(f"{value:.6g}")


def bounds_around(
    defaults: Sequence[float],
    thresholds: Iterable[float],
    factors: Sequence[float] = THRESHOLD_FACTORS,
) -> list[float]:
    """An engine's default bucket bounds plus each threshold times each factor (the threshold
    itself exactly as written), strictly increasing, as engines want them."""
    if any(f <= 0 for f in factors):
        raise ValueError(f"factors must be positive, got {list(factors)}")
    chosen = set(defaults)
    for threshold in thresholds:
        chosen.add(threshold)
        chosen.update(_round_bound(threshold * f) for f in factors)
    ordered: list[float] = []
    for value in sorted(chosen):
        # Drop near-duplicates of float arithmetic.
        if not ordered or not math.isclose(value, ordered[-1], rel_tol=1e-9):
            ordered.append(value)
    return ordered
