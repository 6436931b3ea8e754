"""A small performance model of a vLLM engine under chunked prefill: from the ceilings a study
measures on its first trial (`slotune.measure.capacity.Ceiling`), the workload's shape and one
configuration's token budget and sequence limit, it predicts TTFT and inter-token latency at a
request rate, and the configuration's capacity (the highest rate at which the SLO holds).

The engine runs in steps. A step serves every running sequence one token and, within the
budget `B` (max-num-batched-tokens), a chunk of waiting prompt tokens. Its time is linear in
what it carries:

    step(prefill p, decodes d) = a + p * c_p + d * c_d

The three costs come from the two ceilings: the decode ceiling (short prompts, `C` sequences
decoding) gives a step of `C / decode_tps` = a + C c_d; the prefill ceiling (the workload's
prompts, vLLM's default budget `B0` full of them) gives `B0 / prefill_tps` = a + B0 c_p, or,
when vLLM's defaults stalled their decodes at the ITL percentile, the stall itself (a step
with a whole budget of prefill) where that is longer. The split of the decode step between its
fixed part `a` and its per-sequence part is the one free parameter, `overhead`
(a = overhead * C / decode_tps).

At a rate λ of requests with P prompt and O output tokens, in steady state:
- decodes running: d = λ O t̄ (Little), capped by max-num-seqs;
- mean step: t̄ = a / (1 - λ (P c_p + O c_d)), and the engine saturates as λ (P c_p + O c_d)
  reaches 1;
- a prompt is prefilled in chunks of k = min(B - d, P) tokens, each chunk step lasting
  a + k c_p + d c_d; the fraction of steps that carry a chunk is λ (P / k) t̄;
- an inter-token gap is a chunk step's time where chunks are frequent enough to reach the
  ITL percentile (their fraction above 1 - q), else a plain decode step's: this is the stall
  the chunked-prefill budget trades against TTFT;
- TTFT is the prefill's own time s (P / k chunk steps; a last part-chunk shares its step
  with the next prompt's) plus the wait for the prefill queue, an M/D/1 queue whose
  waiting-time tail is taken as exponential (heavy traffic):
  P(W > t) = u exp(-2 (1 - u) t / s), with u = λ s the prefill queue's utilisation.

What it leaves out: the block size and prefix caching (no term for either), preemption (the KV
cache only caps the decodes it can hold), the fixed work per request, a decode step that grows
with the context it reads (the decode ceiling is measured on short prompts), requests queueing
for a sequence slot when max-num-seqs is below the decodes Little's law asks for (it reports
those rates as saturated rather than as a TTFT), and the spread of TPOT between requests (it
takes the mean where the SLO holds a percentile). It is a prior for where to start, not a
verdict: `bench/sampler_benchmark.py` reports its error on each recorded landscape (on the CPU
example a median of 11-31%; on the H200, where the last three dominate, 29-30%, every
configuration over-predicted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from slotune.measure.capacity import DECODE_CONCURRENCY, Ceiling
from slotune.measure.record import Measurement
from slotune.models import SloSpec
from slotune.tuner.records import TrialRecord
from slotune.tuner.space import Space, clamp_into

DEFAULT_OVERHEAD = 0.5
"""The share of a decode step that does not grow with the number of sequences (a guess until
a landscape says better; `calibrate` fits it)."""


@dataclass(frozen=True)
class Costs:
    """Seconds per step (`fixed`), per prompt token (`prefill`), per decoding sequence."""

    fixed: float
    prefill: float
    decode: float

    @classmethod
    def from_ceiling(
        cls,
        ceiling: Ceiling,
        default_budget: int,
        overhead: float = DEFAULT_OVERHEAD,
        *,
        stall: float | None = None,
    ) -> Costs:
        """The costs the ceilings imply. `stall`, when known, is the longest inter-token gap
        vLLM's defaults showed (their ITL p95 at the target rate, where a whole budget of
        prefill shares a step with the decodes): a prompt token costs at least what that
        gap says, which on the CPU engine was half as much again as the prefill ceiling's."""
        concurrency = ceiling.decode_concurrency or DECODE_CONCURRENCY
        decode_step = concurrency / ceiling.decode_tps
        fixed = overhead * decode_step
        per_sequence = (decode_step - fixed) / concurrency
        prefill_step = default_budget / ceiling.prefill_tps
        per_token = max(prefill_step - fixed, 0.0) / default_budget
        if stall is not None:
            per_token = max(per_token, (stall - fixed) / default_budget)
        return cls(fixed=fixed, prefill=per_token, decode=per_sequence)


def stall_of(measurement: Measurement | None) -> float | None:
    """vLLM's defaults' ITL p95 at the target rate, as their trial recorded it (a compact
    record keeps it only as the SLO's ITL percentile)."""
    if measurement is None:
        return None
    return measurement.itl_p95 or measurement.slo_percentiles.get("itl")


@dataclass(frozen=True)
class Shape:
    """The workload: mean prompt and output tokens per request."""

    prompt: float
    output: float


@dataclass(frozen=True)
class Inputs:
    """What the model takes from a study's trial of vLLM's defaults."""

    costs: Costs
    shape: Shape
    kv_tokens: int | None

    @classmethod
    def from_baseline(
        cls,
        baseline: TrialRecord,
        ceiling: Ceiling,
        output_tokens: float,
        default_budget: int,
        *,
        overhead: float = DEFAULT_OVERHEAD,
        stall: bool = True,
    ) -> Inputs:
        """From the defaults' record (its budget, its stall when `stall`, its KV capacity)
        and the ceilings the study measured."""
        budget = baseline.params.get("max_num_batched_tokens") or default_budget
        costs = Costs.from_ceiling(
            ceiling,
            int(budget),
            overhead,
            stall=stall_of(baseline.measurement) if stall else None,
        )
        kv_tokens = (baseline.facts or {}).get("kv_cache_tokens")
        return cls(costs, Shape(ceiling.prompt_tokens, output_tokens), kv_tokens)


@dataclass(frozen=True)
class Prediction:
    """At one rate: TTFT and ITL at their percentiles and the mean time per output token,
    seconds (inf when saturated), and the decodes running."""

    rate: float
    ttft: float
    itl: float
    tpot: float
    decodes: float


def predict(
    costs: Costs,
    shape: Shape,
    budget: int,
    max_seqs: int,
    rate: float,
    *,
    ttft_quantile: float = 0.9,
    itl_quantile: float = 0.95,
    kv_tokens: int | None = None,
) -> Prediction:
    """TTFT and ITL at `rate` requests/s for a budget and sequence limit (see the module)."""
    load = rate * (shape.prompt * costs.prefill + shape.output * costs.decode)
    if load >= 1:
        return Prediction(rate, math.inf, math.inf, math.inf, math.inf)
    mean_step = costs.fixed / (1 - load)
    decodes = rate * shape.output * mean_step
    cap = float(max_seqs)
    if kv_tokens:
        cap = min(cap, kv_tokens / (shape.prompt + shape.output))
    if decodes >= cap:
        return Prediction(rate, math.inf, math.inf, math.inf, decodes)
    chunk = min(max(budget - decodes, 1.0), shape.prompt)
    chunk_step = costs.fixed + chunk * costs.prefill + decodes * costs.decode
    decode_step = costs.fixed + decodes * costs.decode
    chunk_share = min(1.0, rate * (shape.prompt / chunk) * mean_step)
    itl = chunk_step if chunk_share > 1 - itl_quantile else decode_step
    tpot = decode_step + chunk_share * (chunk_step - decode_step)
    service = shape.prompt / chunk * chunk_step  # a last part-chunk shares its step
    busy = rate * service
    if busy >= 1:
        return Prediction(rate, math.inf, itl, tpot, decodes)
    tail = 1 - ttft_quantile
    wait = 0.0
    if busy > tail:
        wait = service / (2 * (1 - busy)) * math.log(busy / tail)
    return Prediction(rate, wait + service, itl, tpot, decodes)


def capacity(
    costs: Costs,
    shape: Shape,
    slo: SloSpec,
    budget: int,
    max_seqs: int,
    *,
    kv_tokens: int | None = None,
    top: float | None = None,
) -> float:
    """The highest rate (requests/s) at which every TTFT, ITL and TPOT target holds (an e2e
    target is not modelled), found by bisection below the saturation rate (or `top`)."""
    ttft, itl, tpot = slo.ttft, slo.itl, slo.tpot
    saturation = 1 / (shape.prompt * costs.prefill + shape.output * costs.decode)
    high = min(saturation, top) if top else saturation

    def holds(rate: float) -> bool:
        found = predict(
            costs,
            shape,
            budget,
            max_seqs,
            rate,
            ttft_quantile=(ttft.percentile if ttft else 90) / 100,
            itl_quantile=(itl.percentile if itl else 95) / 100,
            kv_tokens=kv_tokens,
        )
        return (
            (ttft is None or found.ttft <= ttft.max_seconds)
            and (itl is None or found.itl <= itl.max_seconds)
            and (tpot is None or found.tpot <= tpot.max_seconds)
        )

    low = 0.0
    if not holds(high * 1e-3):
        return 0.0
    for _ in range(60):
        middle = (low + high) / 2
        if holds(middle):
            low = middle
        else:
            high = middle
    return low


def _levels(dist: BaseDistribution, count: int) -> list[Any]:
    """Up to `count` values of a knob, spread over its range (log-spaced where it is)."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution):
        low, high = dist.low, dist.high
        if dist.log:
            values = [low * (high / low) ** (i / (count - 1)) for i in range(count)]
        else:
            values = [low + (high - low) * i / (count - 1) for i in range(count)]
        return sorted({round(v) for v in values})
    return []


MARGIN = 0.8
"""`suggest` aims inside the SLO by this factor on every bound: the model's capacity error on
the CPU landscape had a median of 17% (bench/results/sampler-benchmark.md), and its best
configuration sat at the edge of a cliff (a budget just short of the one whose stall breaks the
ITL bound), where the run-to-run spread decides."""


def suggest(
    space: Space,
    defaults: dict[str, Any],
    costs: Costs,
    shape: Shape,
    slo: SloSpec,
    *,
    count: int,
    kv_tokens: int | None = None,
    levels: int = 16,
    margin: float = MARGIN,
) -> list[tuple[dict[str, Any], float]]:
    """The `count` configurations of the space the model predicts to carry the most within
    every SLO bound tightened by `margin`, each with its own token budget, with their
    predicted capacities. The token budget and sequence limit go over a grid, every other knob
    stays at vLLM's default (the model has no term for them); of equal predictions, the one
    with vLLM's default sequence limit is taken (the model cannot tell them apart)."""
    tight = slo.model_copy(
        update={
            name: target.model_copy(update={"max_seconds": target.max_seconds * margin})
            for name, target in slo.targets().items()
        }
    )
    budgets = _levels(space["max_num_batched_tokens"], levels)
    base = clamp_into(space, defaults)
    seqs: list[Any] = [None]
    if "max_num_seqs" in space:
        seqs = sorted({base.get("max_num_seqs"), *_levels(space["max_num_seqs"], levels // 2)})
    ranked = []
    for budget in budgets:
        for limit in seqs:
            params = {**base, "max_num_batched_tokens": budget}
            if limit is not None:
                params["max_num_seqs"] = limit
            found = capacity(
                costs, shape, tight, budget, params.get("max_num_seqs") or 256, kv_tokens=kv_tokens
            )
            ranked.append((params, found))
    default_seqs = base.get("max_num_seqs")
    ranked.sort(key=lambda pair: (-round(pair[1], 6), pair[0].get("max_num_seqs") != default_seqs))
    chosen: list[tuple[dict[str, Any], float]] = []
    for params, found in ranked:
        if all(params["max_num_batched_tokens"] != c["max_num_batched_tokens"] for c, _ in chosen):
            chosen.append((params, found))
        if len(chosen) == count:
            break
    return chosen
