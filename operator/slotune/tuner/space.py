"""The search space: which engine settings are tuned, over which values.

Defaults follow what prior tuners and vLLM's own guidance teach (small space, log-scale token
budgets, only the block sizes the attention backend accepts), narrowed or fixed by
`spec.tuning.searchSpace`. Every configuration drawn from it is checked against vLLM's rule
table before launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from slotune.engine import vllm
from slotune.models import EngineArgs, FloatRange, IntRange, LLMDeploymentSpec, SearchSpace

Space = dict[str, BaseDistribution]


@dataclass(frozen=True)
class Platform:
    """What the engine runs on: its attention backend and vLLM's resolved defaults there."""

    name: str
    backend: str
    defaults: dict[str, Any]
    tunes_memory_fraction: bool

    def default_args(self) -> EngineArgs:
        return EngineArgs(**self.defaults)


# vLLM's resolved defaults for `vllm serve` (reference/vllm.md §1.1a, §4).
CPU = Platform(
    name="cpu",
    backend="CPU_ATTN",
    defaults={
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "block_size": 128,
        "enable_prefix_caching": True,
    },
    # On the CPU engine the KV cache is sized by VLLM_CPU_KVCACHE_SPACE.
    tunes_memory_fraction=False,
)
H200 = Platform(
    name="h200",
    backend="FLASH_ATTN",
    defaults={
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 1024,
        "block_size": 16,
        "gpu_memory_utilization": 0.92,
        "enable_prefix_caching": True,
        "kv_cache_dtype": "auto",
    },
    tunes_memory_fraction=True,
)
PLATFORMS = {p.name: p for p in (CPU, H200)}


def platform_for(spec: LLMDeploymentSpec) -> Platform:
    """The platform a spec's pods run on: the CPU engine without GPUs, else a large GPU
    (vLLM's defaults there are those of a GPU with at least 70 GiB)."""
    return CPU if spec.resources.gpus == 0 else H200


def _block_sizes(backend: str) -> tuple[int, ...]:
    rule = vllm.BLOCK_SIZE_RULES[backend]
    candidates = (16, 32, 64, 128, 256)
    return tuple(size for size in candidates if rule.accepts(size))


def default_space(platform: Platform) -> Space:
    """Every knob slotune tunes by default on this platform."""
    cpu = platform.backend == "CPU_ATTN"
    space: Space = {
        "max_num_batched_tokens": IntDistribution(
            128 if cpu else 256, 8192 if cpu else 32768, log=True
        ),
        "max_num_seqs": IntDistribution(8, 256 if cpu else 1024, log=True),
        "block_size": CategoricalDistribution(_block_sizes(platform.backend)),
        "enable_prefix_caching": CategoricalDistribution((True, False)),
    }
    if platform.tunes_memory_fraction:
        space["gpu_memory_utilization"] = FloatDistribution(0.80, 0.95, step=0.01)
    kv_dtypes = tuple(d for d in ("auto", "fp8") if d in vllm.KV_CACHE_DTYPES[platform.backend])
    if not cpu and len(kv_dtypes) > 1:
        space["kv_cache_dtype"] = CategoricalDistribution(kv_dtypes)
    return space


def _narrow(current: BaseDistribution, rule: IntRange | FloatRange) -> BaseDistribution:
    if rule.values is not None:
        return CategoricalDistribution(tuple(rule.values))
    if isinstance(current, IntDistribution):
        low = int(rule.min) if rule.min is not None else current.low
        high = int(rule.max) if rule.max is not None else current.high
        return IntDistribution(low, high, log=current.log)
    if isinstance(current, FloatDistribution):
        low_f = rule.min if rule.min is not None else current.low
        high_f = rule.max if rule.max is not None else current.high
        return FloatDistribution(low_f, high_f, step=current.step)
    return current


def build_space(platform: Platform, narrowing: SearchSpace) -> Space:
    """The default space with the spec's narrowing applied; a single value fixes a knob."""
    space = default_space(platform)
    for name, rule in narrowing:
        if rule is None:
            continue
        if isinstance(rule, IntRange | FloatRange):
            base = space.get(name) or (
                FloatDistribution(0.5, 1.0, step=0.01)
                if isinstance(rule, FloatRange)
                else IntDistribution(1, 1 << 20, log=True)
            )
            space[name] = _narrow(base, rule)
        else:
            space[name] = CategoricalDistribution(tuple(rule))
    return space


def clamp_into(space: Space, params: dict[str, Any]) -> dict[str, Any]:
    """Params moved to the nearest value the space allows (to enqueue a seed configuration)."""
    result: dict[str, Any] = {}
    for name, dist in space.items():
        if name not in params or params[name] is None:
            continue
        value = params[name]
        if isinstance(dist, IntDistribution | FloatDistribution):
            value = min(max(value, dist.low), dist.high)
        elif isinstance(dist, CategoricalDistribution) and value not in dist.choices:
            numeric = [c for c in dist.choices if isinstance(c, int | float)]
            if not numeric or isinstance(value, bool):
                continue
            value = min(numeric, key=lambda c: abs(c - value))
        result[name] = value
    return result


PARAM_SHORT = {
    "max_num_batched_tokens": "batched",
    "max_num_seqs": "seqs",
    "block_size": "block",
    "gpu_memory_utilization": "gmu",
    "enable_prefix_caching": "prefix",
    "kv_cache_dtype": "kv",
}


def describe_params(params: dict[str, object]) -> str:
    parts = []
    for name, value in params.items():
        short = PARAM_SHORT.get(name, name)
        if isinstance(value, bool):
            parts.append(f"{short}={'on' if value else 'off'}")
        else:
            parts.append(f"{short}={value}")
    return " ".join(parts)
