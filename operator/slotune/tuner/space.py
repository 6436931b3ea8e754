"""The search space: which engine settings are tuned, over which values.

Defaults follow what prior tuners and vLLM's own guidance teach (small space, log-scale token
budgets, only the block sizes the attention backend accepts), narrowed or fixed by
`spec.tuning.searchSpace`. Every configuration drawn from it is checked against its engine's
rule table before launch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from slotune.engine import DEFAULT_KIND, ENGINES, engine_for
from slotune.engine.base import Engine
from slotune.engine.knobs import FloatSpan, IntSpan, Knob, Range
from slotune.models import EngineArgs, FloatRange, IntRange, LLMDeploymentSpec, SearchSpace

Space = dict[str, BaseDistribution]


@dataclass(frozen=True)
class Platform:
    """What runs the trials: the engine, the hardware it runs on (by name) with its attention
    backend, and the engine's resolved defaults there (from its knob registry, e.g.
    `slotune.engine.vllm.rules.KNOBS`)."""

    name: str
    backend: str
    engine: Engine = ENGINES[DEFAULT_KIND]
    spread: float = 0.0
    """How much one configuration's capacity moves between engine starts beyond one start's
    interval (sd of ln rate), measured on this platform: every capacity's interval includes it
    (`capacity.Capacity.interval`)."""
    column: str = ""
    """The knob registry's column for this hardware (its search ranges and the engine's
    defaults there), when it is not `name`: cards the engine treats alike share one."""

    @property
    def table(self) -> str:
        return self.column or self.name

    @property
    def defaults(self) -> dict[str, Any]:
        return {
            k.field: k.defaults[self.table]
            for k in in_draw_order(self.engine)
            if self.table in k.defaults
        }

    def default_args(self) -> EngineArgs:
        return EngineArgs(**self.defaults)


CPU = Platform(name="cpu", backend="CPU_ATTN", spread=0.073)
"""The spread: vLLM's defaults on five fresh CPU engines in each of two sittings, the `make
tune` example (`bench/capacity_repeatability.py --engines 5`, seeds 300-304 on 2026-12-06 and
400-404 on 2026-12-07): 2.14-2.39 req/s (1.12x) in the first, where the starts spread no more
than their own intervals state (sigma_b 0.000), and 2.10-2.80 (1.34x) in the second (sigma_b
0.124). Pooled over both (eight degrees of freedom, `bench/variance_components.components`):
sigma_b 0.073 in ln rate beyond each start's own interval (mean within-start sd 0.067; 90%
interval 0.024-0.156). The second sitting's spread is not explained (the engine processes'
placement on two busy cores is the suspect left; the uni-process executor, which would remove
it, is not the same engine on this platform), so both sittings count. Across hours a CPU
instance's speed moves far more (sigma 0.27 between the CPU landscape's two runs four hours
apart, `bench/variance_components.py`), which is why the example is scaled to the machine when
it starts and a study's trials run in one sitting."""
H200 = Platform(name="h200", backend="FLASH_ATTN", spread=0.053)
"""The spread: vLLM's defaults on five H200 starts of the study's landscape, refitted
(`bench/variance_components.py bench/landscapes/h200-study.jsonl`): 13.9-16.1 req/s, sigma_b
0.053 in ln rate beyond each start's own interval (90% interval 0.030-0.136, four degrees of
freedom)."""
H100 = Platform(name="h100", backend="FLASH_ATTN", spread=0.025, column="h200")
"""vLLM's defaults and ranges are the H200's (both are GPUs with at least 70 GiB). The spread:
eight fresh engine starts on H100 80GBs, each in one sitting as a study's trials run: vLLM's
defaults six times (13.4-14.8 req/s: `bench/results/gpu-repeatability-h100-seed100.json`, the
partial repeat beside it, and the H100 study's trials #0 and #3, `bench/results/gpu-study-h100/`)
and the study's winner twice (15.9, 15.7). Refitted (`bench/variance_components.py`'s method),
sigma_b 0.025 in ln rate beyond each start's own interval (within-start sd 0.020; 90% interval
0.010-0.059, six degrees of freedom). The first three starts alone showed none (0.000, two
degrees of freedom): the study's re-measurement of the defaults, 10% under its first start on
the same machine, is what three could not show. The H200's figure above spans five machines,
the card-to-card part included."""
PLATFORMS = {p.name: p for p in (CPU, H200, H100)}


def platform_for(spec: LLMDeploymentSpec) -> Platform:
    """The platform a spec's pods run on: the CPU engine without GPUs, else a large GPU
    (vLLM's defaults there are those of a GPU with at least 70 GiB), with the spec's engine."""
    hardware = CPU if spec.resources.gpus == 0 else H200
    return replace(hardware, engine=engine_for(spec.engine.kind))


# The order in which a study draws the knobs. Another order would change what a seeded study
# draws (a resumed study, the sampler benchmark's seeds); a knob not listed is drawn last.
_DRAW_ORDER = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "block_size",
    "enable_prefix_caching",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "quantization",
)


def in_draw_order(engine: Engine) -> tuple[Knob, ...]:
    """The engine's knobs in the order a study draws them."""
    return tuple(
        sorted(
            engine.knobs,
            key=lambda k: (
                _DRAW_ORDER.index(k.field) if k.field in _DRAW_ORDER else len(_DRAW_ORDER)
            ),
        )
    )


def _distribution(
    engine: Engine, knob: Knob, rule: Range, backend: str, allow_lossy: bool
) -> BaseDistribution | None:
    if isinstance(rule, IntSpan):
        return IntDistribution(rule.low, rule.high, log=rule.log)
    if isinstance(rule, FloatSpan):
        return FloatDistribution(rule.low, rule.high, step=rule.step)
    kept = tuple(
        v
        for v in rule.values
        if engine.backend_accepts(knob.field, v, backend) and (allow_lossy or not knob.is_lossy(v))
    )
    return CategoricalDistribution(kept) if len(kept) > 1 else None


def default_space(platform: Platform, *, allow_lossy: bool = False) -> Space:
    """Every knob slotune tunes by default on this platform (the registry's search ranges);
    lossy values (fp8 weights, an fp8 KV cache) only where the spec allows them, since each
    must then pass the quality gate."""
    space: Space = {}
    for knob in in_draw_order(platform.engine):
        rule = knob.search.get(platform.table)
        distribution = (
            _distribution(platform.engine, knob, rule, platform.backend, allow_lossy)
            if rule
            else None
        )
        if distribution is not None:
            space[knob.field] = distribution
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


def build_space(platform: Platform, narrowing: SearchSpace, *, allow_lossy: bool = False) -> Space:
    """The default space with the spec's narrowing applied; a single value fixes a knob. (A
    narrowing that names lossy values without `allow_lossy` is refused by the spec itself.)"""
    space = default_space(platform, allow_lossy=allow_lossy)
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


PARAM_SHORT = {knob.field: knob.short for engine in ENGINES.values() for knob in engine.knobs}


def describe_params(params: dict[str, object]) -> str:
    parts = []
    for name, value in params.items():
        short = PARAM_SHORT.get(name, name)
        if isinstance(value, bool):
            parts.append(f"{short}={'on' if value else 'off'}")
        else:
            parts.append(f"{short}={value}")
    return " ".join(parts)
