"""The replica arithmetic of `spec.scaling`, table-tested: the count, the bounds, what holds
it, the no-fight rule for External, and the capacity a count is divided by."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from slotune import scaling
from slotune.measure.capacity import Capacity as Measured
from slotune.models import ReplicaCapacity, ScalingSpec, TuningState, TuningStatus
from slotune.tuner.loop import fewest_replicas
from slotune.tuner.records import TrialRecord, TrialState
from support.specs import llm_spec, tuning

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
NINE_EIGHT = scaling.Capacity(rate=9.8, low=9.4, high=10.1, source="trial 4 of study 1")


@pytest.mark.parametrize(
    ("demand", "per_replica", "headroom", "needed"),
    [
        (0.0, 9.8, 0.1, 0),  # no traffic needs no replica (the bounds keep the minimum)
        (8.9, 9.8, 0.1, 1),  # 9.79 <= 9.8
        (9.0, 9.8, 0.1, 2),  # 9.9 > 9.8
        (21.3, 9.8, 0.1, 3),  # the example: 23.43 / 9.8 = 2.39
        (19.6, 9.8, 0.0, 2),  # exactly two replicas' worth is two, not three
        (17.6, 15.7, 0.0, 2),  # the H200 study: 17.6 req/s over 15.7 per replica
        (1.0, 0.3, 0.1, 4),
    ],
)
def test_replicas_needed(demand: float, per_replica: float, headroom: float, needed: int) -> None:
    assert scaling.replicas_needed(demand, per_replica, headroom) == needed


def test_a_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        scaling.replicas_needed(1.0, 0.0, 0.1)


def capacity_mode(**fields: Any) -> ScalingSpec:
    return ScalingSpec.model_validate({"mode": "Capacity", **fields})


@pytest.mark.parametrize(
    ("case", "fields", "current", "demand", "unschedulable", "replicas", "limited"),
    [
        # Up as soon as the window's peak needs more; the event's figures say why.
        ("up", {}, 2, 21.3, None, 3, None),
        # Down once the whole window's peak needs fewer (the peak is the window's).
        ("down", {}, 3, 8.0, None, 1, None),
        ("steady", {}, 2, 12.0, None, 2, None),
        # Down only with the tolerance to spare: 2 x 9.8 carries 17.5 x 1.1 (19.25), but not
        # 10% more, so a demand hovering at the boundary does not flap the count.
        ("at a boundary", {}, 3, 17.5, None, 3, None),
        ("clear of it", {}, 3, 15.0, None, 2, None),
        # The bounds: never below minReplicas, never above maxReplicas (and it says so).
        ("floor", {"minReplicas": 2}, 2, 0.5, None, 2, None),
        ("ceiling", {"maxReplicas": 4}, 4, 60.0, None, 4, "TooManyReplicas"),
        ("to the ceiling", {"maxReplicas": 4}, 2, 60.0, None, 4, "TooManyReplicas"),
        # A pod that cannot be scheduled stops further scale-up, not scale-down.
        ("no GPU", {}, 2, 30.0, "0/3 nodes: Insufficient nvidia.com/gpu", 2, "Unschedulable"),
        ("no GPU, down", {}, 3, 8.0, "0/3 nodes: Insufficient nvidia.com/gpu", 1, None),
        # No demand to decide from: hold the count, whatever it is.
        ("unknown demand", {}, 3, None, None, 3, "NoDemand"),
        # The first decision starts from minReplicas.
        ("first", {"minReplicas": 1}, None, 21.3, None, 3, None),
        ("first, unknown", {"minReplicas": 2}, None, None, None, 2, "NoDemand"),
        # A count outside bounds that were just changed is brought inside them.
        ("bounds moved", {"maxReplicas": 2}, 5, None, None, 2, "NoDemand"),
    ],
)
def test_capacity_scaling(  # noqa: PLR0917 - one parameter per column of the table
    case: str,
    fields: dict[str, Any],
    current: int | None,
    demand: float | None,
    unschedulable: str | None,
    replicas: int,
    limited: str | None,
) -> None:
    scale = scaling.decide(
        capacity_mode(**fields),
        spec_replicas=7,  # never read in Capacity mode
        current=current,
        demand=demand,
        capacity=NINE_EIGHT,
        headroom=0.1,
        unschedulable=unschedulable,
    )
    assert scale.replicas == replicas, case
    assert (scale.limited[0] if scale.limited else None) == limited, case
    start = current if current is not None else fields.get("minReplicas", 1)
    if replicas != min(max(start, 1), fields.get("maxReplicas", 10)):
        assert scale.change is not None, case
        assert scale.change.endswith(f"→ {replicas} replicas"), case
    else:
        assert scale.change is None, case


def test_the_event_gives_the_numbers() -> None:
    scale = scaling.decide(
        capacity_mode(), spec_replicas=1, current=2, demand=21.3, capacity=NINE_EIGHT, headroom=0.1
    )
    assert scale.change == "demand 21.3 req/s x 1.1 > 2 x 9.8 req/s: 2 → 3 replicas"
    down = scaling.decide(
        capacity_mode(), spec_replicas=1, current=3, demand=8.0, capacity=NINE_EIGHT, headroom=0.1
    )
    assert down.change == "demand 8 req/s x 1.1 <= 1 x 9.8 req/s: 3 → 1 replicas"


def test_without_a_capacity_the_count_holds_and_says_what_to_do() -> None:
    scale = scaling.decide(
        capacity_mode(), spec_replicas=1, current=2, demand=50.0, capacity=None, headroom=0.1
    )
    assert scale.replicas == 2
    assert scale.limited is not None
    assert scale.limited[0] == "NoCapacity"
    assert "capacityPerReplica" in scale.limited[1]


def test_an_in_place_study_holds_the_count() -> None:
    spec = llm_spec(tuning=tuning(strategy="InPlace"), scaling={"mode": "Capacity"})
    running = TuningStatus(state=TuningState.TUNING)
    why = scaling.study_holds(spec, running)
    assert why is not None
    scale = scaling.decide(
        spec.scaling,
        spec_replicas=1,
        current=2,
        demand=50.0,
        capacity=NINE_EIGHT,
        headroom=0.1,
        hold=why,
    )
    assert (scale.replicas, scale.limited and scale.limited[0]) == (2, "Held")
    # A Canary study measures on its own pods: the serving count follows the demand.
    canary = llm_spec(tuning=tuning(strategy="Canary"), scaling={"mode": "Capacity"})
    assert scaling.study_holds(canary, running) is None
    assert scaling.study_holds(spec, TuningStatus(state=TuningState.COMPLETED)) is None


@pytest.mark.parametrize("mode", ["Fixed", "External"])
@pytest.mark.parametrize("demand", [None, 0.5, 60.0])
def test_fixed_and_external_never_change_spec_replicas(mode: str, demand: float | None) -> None:
    """External: the HPA or KEDA writes spec.replicas through the scale subresource; slotune
    follows it whatever the demand, and only publishes the replicas needed."""
    scale = scaling.decide(
        ScalingSpec(mode=mode),  # type: ignore[arg-type]
        spec_replicas=3,
        current=5,
        demand=demand,
        capacity=NINE_EIGHT,
        headroom=0.1,
        unschedulable="no GPU",
    )
    assert scale.replicas == 3
    assert scale.change is None
    assert scale.limited is None
    assert scale.needed == (
        None if demand is None else scaling.replicas_needed(demand, NINE_EIGHT.rate, 0.1)
    )


def test_the_bounds_are_checked() -> None:
    with pytest.raises(ValidationError, match="must not exceed maxReplicas"):
        ScalingSpec.model_validate({"mode": "Capacity", "minReplicas": 5, "maxReplicas": 2})
    with pytest.raises(ValidationError):
        ScalingSpec.model_validate({"mode": "Capacity", "minReplicas": 0})


def test_the_capacity_is_the_measured_one_only_while_the_pods_run_it() -> None:
    """A study's figure is the capacity of one configuration (by config hash); another
    configuration falls back to the spec's figure, or to none."""
    measured = TuningStatus(
        replica_capacity=ReplicaCapacity(hash="abc", trial=4, study=2, rate=9.8, low=9.4)
    )
    spec = llm_spec(scaling={"mode": "Capacity", "capacityPerReplica": 5.0})
    found = scaling.serving_capacity(spec, measured, "abc")
    assert found == scaling.Capacity(rate=9.8, low=9.4, high=None, source="trial 4 of study 2")
    other = scaling.serving_capacity(spec, measured, "def")
    assert other == scaling.Capacity(rate=5.0, source="spec.scaling.capacityPerReplica")
    bare = llm_spec(scaling={"mode": "Capacity"})
    assert scaling.serving_capacity(bare, measured, "def") is None
    assert scaling.serving_capacity(bare, None, "abc") is None


def test_a_synthetic_workload_is_a_floor_under_the_demand() -> None:
    assert scaling.demand_floor(llm_spec(tuning=tuning())) == 2.0
    assert scaling.demand_floor(llm_spec()) is None


def test_status_and_condition_of_a_decision() -> None:
    spec = llm_spec(scaling={"mode": "Capacity"})
    scale = scaling.decide(
        spec.scaling, spec_replicas=1, current=2, demand=21.3, capacity=NINE_EIGHT, headroom=0.1
    )
    found = scaling.outcome(spec, scale, demand=21.3, capacity=NINE_EIGHT, previous=None, now=NOW)
    assert found.status is not None
    assert (found.status.desired_replicas, found.status.needed_replicas) == (3, 3)
    assert found.status.last_scale_time == NOW
    assert found.row == (
        "ScalingLimited",
        "False",
        "WithinBounds",
        "3 replica(s) of 9.8 req/s carry the peak demand 21.3 req/s with 10% headroom",
    )
    # Fixed scaling shows no scaling status and no condition.
    fixed = llm_spec()
    same = scaling.decide(
        fixed.scaling, spec_replicas=1, current=None, demand=None, capacity=None, headroom=0.1
    )
    assert scaling.outcome(fixed, same, demand=None, capacity=None, previous=None, now=NOW) == (
        scaling.Outcome(1, None, None)
    )


def test_the_fewest_replicas_then_the_fewest_overrides_carry_the_target() -> None:
    """The H200 study's end (bench/gpu/results/h200-capacity-recommendation.txt): vLLM's
    defaults carry 14 req/s and #4 15.7 against a 17.6 target. Two replicas of either carry it,
    and at equal GPUs the one with fewer overrides wins; a third configuration that needs
    three replicas never does."""
    defaults = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}

    def candidate(number: int, rate: float, **params: int) -> tuple[Measured, TrialRecord]:
        found = Measured(capacity=rate, upper=rate * 1.12, target_rate=17.6, feasible=False,
                         stopped="bracketed")  # fmt: skip
        record = TrialRecord(number=number, params={**defaults, **params},
                             state=TrialState.MEASURED)  # fmt: skip
        return found, record

    h200 = [
        candidate(0, 14.0),
        candidate(4, 15.7, max_num_batched_tokens=12940, max_num_seqs=82),
        candidate(2, 6.98, max_num_batched_tokens=512, max_num_seqs=147),
    ]
    chosen = fewest_replicas(h200, 17.6, defaults)
    assert chosen is not None
    assert (chosen.record.number, chosen.count) == (0, 2)
    # A configuration that alone needs fewer replicas wins whatever its overrides.
    wider = [*h200, candidate(7, 9.0, max_num_seqs=64)]
    assert fewest_replicas(wider, 30.0, defaults).record.number == 4  # type: ignore[union-attr]
    assert fewest_replicas([], 17.6, defaults) is None
