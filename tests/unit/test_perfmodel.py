"""The performance model of chunked prefill (pure arithmetic) and the study's model-guided
start."""

from __future__ import annotations

import math
from typing import Any

import pytest
from tests.support.specs import llm_spec, tuning, workload

from slotune.engine.startup import StartupFacts
from slotune.measure.capacity import Capacity, Ceiling, MeasureRequest
from slotune.measure.record import Measurement
from slotune.models import LLMDeploymentSpec, SloSpec
from slotune.runtime import EngineConfig
from slotune.tuner import perfmodel
from slotune.tuner.loop import NextTrial, Tuner, TunerOptions
from slotune.tuner.perfmodel import Costs, Shape, capacity, predict
from slotune.tuner.records import MemoryStore
from slotune.tuner.space import CPU, build_space

# About the CPU example on a machine of the README's `make tune` runs: 2048-token prompts.
CEILING = Ceiling(prefill_tps=3500.0, decode_tps=640.0, decode_concurrency=64, prompt_tokens=2048)
SHAPE = Shape(prompt=2048, output=32)
COSTS = Costs.from_ceiling(CEILING, default_budget=2048)
SLO = SloSpec.model_validate(
    {"ttft": {"percentile": 90, "maxSeconds": 16.0}, "itl": {"percentile": 95, "maxSeconds": 0.3}}
)


def test_the_costs_give_back_both_ceilings() -> None:
    decode_step = COSTS.fixed + 64 * COSTS.decode
    assert 64 / decode_step == pytest.approx(CEILING.decode_tps)
    prefill_step = COSTS.fixed + 2048 * COSTS.prefill
    assert 2048 / prefill_step == pytest.approx(CEILING.prefill_tps)


def test_a_stall_longer_than_the_prefill_ceiling_implies_sets_the_cost_of_a_prompt_token() -> None:
    """On the CPU engine vLLM's defaults stalled decodes for 266 ms where the prefill ceiling
    implies 169 ms (bench/results/make-tune-runs.md, run 15): a chunk step costs what the
    stall says."""
    stalled = Costs.from_ceiling(CEILING, default_budget=2048, stall=1.0)
    assert stalled.fixed + 2048 * stalled.prefill == pytest.approx(1.0)
    assert Costs.from_ceiling(CEILING, default_budget=2048, stall=0.01) == COSTS


def test_a_smaller_budget_shortens_the_stall_and_lengthens_the_prefill() -> None:
    """At a rate where more than one gap in twenty holds a prefill chunk."""
    large = predict(COSTS, SHAPE, 2048, 128, 0.8)
    small = predict(COSTS, SHAPE, 256, 128, 0.8)
    assert large.itl > 2048 * COSTS.prefill  # a whole prompt's prefill in one gap
    assert small.itl < large.itl / 3
    assert small.ttft > large.ttft


def test_stalls_below_the_percentile_do_not_set_it() -> None:
    """At a low rate, fewer than one gap in twenty holds a chunk: ITL p95 is a plain step."""
    quiet = predict(COSTS, SHAPE, 2048, 128, 0.2)
    assert quiet.itl == pytest.approx(COSTS.fixed + quiet.decodes * COSTS.decode)


def test_latency_grows_with_the_rate_until_the_engine_saturates() -> None:
    rates = [0.1, 0.5, 1.0, 1.5]
    ttfts = [predict(COSTS, SHAPE, 512, 128, r).ttft for r in rates]
    assert ttfts == sorted(ttfts)
    saturation = 1 / (SHAPE.prompt * COSTS.prefill + SHAPE.output * COSTS.decode)
    assert math.isinf(predict(COSTS, SHAPE, 512, 128, saturation * 1.01).ttft)


def test_the_sequence_limit_and_the_kv_cache_cap_the_decodes() -> None:
    assert math.isinf(predict(COSTS, SHAPE, 512, 1, 1.0).itl)
    assert math.isinf(predict(COSTS, SHAPE, 512, 128, 1.0, kv_tokens=2080).itl)


def test_capacity_is_where_the_slo_gives_out() -> None:
    found = capacity(COSTS, SHAPE, SLO, 512, 128)
    assert found > 0
    below = predict(COSTS, SHAPE, 512, 128, found * 0.99, ttft_quantile=0.9, itl_quantile=0.95)
    above = predict(COSTS, SHAPE, 512, 128, found * 1.02, ttft_quantile=0.9, itl_quantile=0.95)
    assert below.ttft <= 16.0
    assert below.itl <= 0.3
    assert above.ttft > 16.0 or above.itl > 0.3


def test_the_budget_between_stalls_and_slow_prefill_carries_the_most() -> None:
    """The example's story: vLLM's default budget stalls the decodes, a tiny one prefills too
    slowly, one between carries more than either."""
    by_budget = {b: capacity(COSTS, SHAPE, SLO, b, 128) for b in (128, 512, 2048)}
    assert by_budget[512] > by_budget[2048]
    assert by_budget[512] > by_budget[128]


# -- the model-guided start ---------------------------------------------------------------------


def spec() -> LLMDeploymentSpec:
    return llm_spec(
        slo=SLO.model_dump(by_alias=True, exclude_none=True),
        tuning=tuning(workload(prompt=2048, rate=0.5), maxTrials=6, seed=3),
    )


class Engine:
    def __init__(self, url: str) -> None:
        self.base_url = url
        self.facts = StartupFacts(kv_cache_tokens=200_000)

    def stop(self) -> None:
        pass


class ModelledRuntime:
    """Answers every configuration with the model's own capacity (so the test is about where
    the study goes, not about the model's error)."""

    def __init__(self) -> None:
        self.started: list[dict[str, Any]] = []

    def start(self, config: EngineConfig, *, timeout: float) -> Engine:
        self.started.append(config.args.model_dump())
        return Engine(f"m://{len(self.started)}")

    def measure(self, base_url: str, request: MeasureRequest) -> Measurement:
        args = self.started[int(base_url.removeprefix("m://")) - 1]
        found = capacity(COSTS, SHAPE, SLO, args["max_num_batched_tokens"], args["max_num_seqs"])
        return Measurement(
            capacity=Capacity(
                capacity=found,
                upper=found * 1.05,
                target_rate=request.target_rate,
                feasible=found >= request.target_rate,
                stopped="bracketed",
            ),
            ceiling=CEILING if request.measure_ceiling else None,
        )


def tuner(model_start: int, records: list[Any] | None = None) -> Tuner:
    """A study of `spec()` on the model's own engine, from `records` if given."""
    runtime = ModelledRuntime()
    return Tuner(
        spec(),
        runtime=runtime,
        measure=runtime.measure,
        platform=CPU,
        model="tiny",
        served_name="tiny",
        store=MemoryStore(records),
        options=TunerOptions(model_start=model_start, finalists=0, patience=10),
        clock=lambda: 0.0,
    )


def study(model_start: int) -> list[Any]:
    return tuner(model_start).run().records


def test_the_trials_after_the_defaults_go_where_the_model_predicts_the_most() -> None:
    records = study(model_start=2)
    assert [r.label for r in records[:3]] == ["vllm-defaults", "model-1", "model-2"]
    space = build_space(CPU, spec().tuning.search_space)
    top = perfmodel.suggest(space, CPU.defaults, COSTS, SHAPE, SLO, count=3, kv_tokens=200_000)
    assert [r.params for r in records[1:3]] == [params for params, _ in top[:2]]
    # Aimed inside the SLO: what the (model's own) engine carries is at least the prediction.
    assert records[1].score >= top[0][1]
    budgets = [r.params["max_num_batched_tokens"] for r in records[1:3]]
    assert len(set(budgets)) == 2
    assert all(r.params["max_num_seqs"] == CPU.defaults["max_num_seqs"] for r in records[1:3])


def test_the_model_aims_inside_the_slo() -> None:
    space = build_space(CPU, spec().tuning.search_space)
    loose = perfmodel.suggest(space, CPU.defaults, COSTS, SHAPE, SLO, count=1, margin=1.0)
    tight = perfmodel.suggest(space, CPU.defaults, COSTS, SHAPE, SLO, count=1, margin=0.5)
    assert tight[0][1] < loose[0][1]


def test_without_it_the_sampler_chooses() -> None:
    assert not any((r.label or "").startswith("model") for r in study(model_start=0))


def test_a_study_rebuilt_during_the_model_start_plans_the_same_next_trial() -> None:
    """(After it, the sampler's draws move on by design: `Tuner` reseeds a rebuilt study.)"""
    whole = study(model_start=2)
    for done in (1, 2):
        planned = tuner(2, whole[:done]).plan()
        assert isinstance(planned, NextTrial)
        assert (planned.params, planned.label) == (whole[done].params, whole[done].label)
    rebuilt_after = tuner(2, whole[:3]).plan()
    assert isinstance(rebuilt_after, NextTrial)
    assert rebuilt_after.label is None  # no model trial queued twice
