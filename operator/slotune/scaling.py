"""How many serving replicas run: the arithmetic of `spec.scaling`, pure and table-tested.

- **Fixed**: `spec.replicas`, as written.
- **External**: `spec.replicas` too, which an HPA or a KEDA ScaledObject writes through the
  LLMDeployment's scale subresource. slotune never changes it: it only publishes the figures
  (demand, capacity per replica, the replicas needed) for them to scale on.
- **Capacity**: `ceil(demand x (1 + headroom) / capacity per replica)` within
  `minReplicas..maxReplicas`.

The demand is the *peak* arrival rate over the stabilization window, as Prometheus keeps it,
so the count goes up as soon as the newest minute needs more, and down only once the whole
window needs fewer, with `SCALE_IN_TOLERANCE` to spare: HPA's scale-down stabilization and
tolerance, with the window's history kept in Prometheus rather than in the operator's
memory. A restart therefore loses nothing, and a count is never lowered below what the
window's peak needs. Without a demand or a capacity to decide from, the count is held where
it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from slotune.models import (
    LLMDeploymentSpec,
    ScalingSpec,
    ScalingStatus,
    TuningState,
    TuningStatus,
)
from slotune.status import ConditionRow

# A demand this close to a whole number of replicas' worth counts as that number: the
# capacity's own uncertainty is percents, not parts in a billion.
_EXACT = 1e-9
SCALE_IN_TOLERANCE = 0.1
"""Fewer replicas must carry the window's peak with this much to spare beyond the headroom
before the count comes down (HPA's default tolerance): a demand that hovers at a boundary
between two counts would otherwise take the count down and up again every window (seen in
`bench/results/scaling-in-cluster.json`: 3 → 2 at 9.73 req/s, 2 → 3 at 10.1, with 2 x 5.47
carrying 9.95)."""


def replicas_needed(demand: float, per_replica: float, headroom: float) -> int:
    """`ceil(demand x (1 + headroom) / per_replica)`; no demand needs no replica."""
    if per_replica <= 0:
        raise ValueError(f"a capacity per replica must be positive (got {per_replica})")
    if demand <= 0:
        return 0
    return math.ceil(demand * (1 + headroom) / per_replica - _EXACT)


@dataclass(frozen=True)
class Capacity:
    """What one replica of the serving configuration carries within the SLO (requests/s)."""

    rate: float
    low: float | None = None
    high: float | None = None
    source: str = ""

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.rate:.3g} [{self.low:.3g}, {self.high:.3g}] req/s"
        return f"{self.rate:.3g} req/s"


def serving_capacity(
    spec: LLMDeploymentSpec, tuning: TuningStatus | None, active_hash: str
) -> Capacity | None:
    """The capacity per replica of what the serving pods run (config hash `active_hash`): the
    study's confirmed figure when the pods run the configuration it measured; otherwise
    `scaling.capacityPerReplica`, if given."""
    measured = tuning.replica_capacity if tuning is not None else None
    if measured is not None and active_hash and measured.hash == active_hash:
        return Capacity(
            rate=measured.rate,
            low=measured.low,
            high=measured.high,
            source=f"trial {measured.trial} of study {measured.study}",
        )
    given = spec.scaling.capacity_per_replica
    if given is not None:
        return Capacity(rate=given, source="spec.scaling.capacityPerReplica")
    return None


def demand_floor(spec: LLMDeploymentSpec) -> float | None:
    """The study's Synthetic rate: the load the spec says to expect, which the replicas carry
    before live traffic shows it (live demand above it raises the count)."""
    workload = spec.tuning.workload
    if spec.tuning.enabled and workload.source == "Synthetic":
        return workload.request_rate
    return None


@dataclass(frozen=True)
class Scale:
    """One decision: the replicas the serving Deployment gets, and why."""

    replicas: int
    current: int | None = None  # the count before this decision
    needed: int | None = None  # before the bounds; None when it could not be computed
    # Why the count is held below what is needed, or cannot be decided: (reason, message) for
    # the ScalingLimited condition; None when nothing limits it.
    limited: tuple[str, str] | None = None
    change: str | None = None  # "2 → 3 replicas" and its figures, for an Event, when changed


def decide(
    scaling: ScalingSpec,
    *,
    spec_replicas: int,
    current: int | None,
    demand: float | None,
    capacity: Capacity | None,
    headroom: float,
    unschedulable: str | None = None,
    hold: str | None = None,
) -> Scale:
    """The replica count for the serving Deployment.

    `current`: the count slotune set last (None before the first decision); `demand`: the
    peak arrival rate over the stabilization window (None when Prometheus cannot tell);
    `unschedulable`: why a serving pod cannot be placed (no further scale-up then); `hold`:
    why the count must stay where it is for now (a study measuring the serving pods)."""
    if scaling.mode != "Capacity":
        # Fixed, or External: spec.replicas is the count, written by the user or through the
        # scale subresource by their autoscaler. slotune never fights it.
        needed = (
            replicas_needed(demand, capacity.rate, headroom)
            if demand is not None and capacity is not None
            else None
        )
        return Scale(replicas=spec_replicas, current=current, needed=needed)

    low, high = scaling.min_replicas, scaling.max_replicas
    now = min(max(current if current is not None else low, low), high)
    if hold is not None:
        return Scale(replicas=now, current=now, limited=("Held", hold))
    if capacity is None:
        return Scale(
            replicas=now,
            current=now,
            limited=(
                "NoCapacity",
                f"holding {now} replica(s): no capacity per replica is known for the serving "
                "configuration; run a study (tuning.enabled) or set "
                "scaling.capacityPerReplica",
            ),
        )
    if demand is None:
        return Scale(
            replicas=now,
            current=now,
            limited=(
                "NoDemand",
                f"holding {now} replica(s): the arrival rate cannot be read from Prometheus",
            ),
        )
    needed = replicas_needed(demand, capacity.rate, headroom)
    if needed < now:
        # Down only as far as the window's peak leaves the tolerance to spare.
        needed = max(
            needed, replicas_needed(demand * (1 + SCALE_IN_TOLERANCE), capacity.rate, headroom)
        )
    wanted = min(max(needed, low), high)
    limited: tuple[str, str] | None = None
    if needed > high:
        limited = (
            "TooManyReplicas",
            f"the demand needs {needed} replicas; maxReplicas is {high}",
        )
    if wanted > now and unschedulable is not None:
        wanted = now
        limited = (
            "Unschedulable",
            f"holding {now} replica(s) of the {needed} needed: a serving pod cannot be "
            f"scheduled ({unschedulable})",
        )
    change = None
    if wanted != now:
        relation = ">" if wanted > now else "<="
        base = now if wanted > now else wanted
        change = (
            f"demand {demand:.3g} req/s x {1 + headroom:.3g} {relation} "
            f"{base} x {capacity.rate:.3g} req/s: {now} → {wanted} replicas"
        )
    return Scale(replicas=wanted, current=now, needed=needed, limited=limited, change=change)


def study_holds(spec: LLMDeploymentSpec, tuning: TuningStatus | None) -> str | None:
    """Why the count must stay put: an InPlace study measures on the serving pods, so the
    load its Jobs send is no demand, and a new replica would join the trial."""
    if (
        spec.tuning.strategy == "InPlace"
        and tuning is not None
        and tuning.state == TuningState.TUNING
    ):
        return "an InPlace study is measuring on the serving pods"
    return None


SCALING_LIMITED = "ScalingLimited"


@dataclass(frozen=True)
class Outcome:
    """A decision as status shows it: the figures, and the ScalingLimited condition row
    (Capacity scaling only)."""

    replicas: int
    status: ScalingStatus | None
    row: ConditionRow | None


def outcome(
    spec: LLMDeploymentSpec,
    scale: Scale,
    *,
    demand: float | None,
    capacity: Capacity | None,
    previous: ScalingStatus | None,
    now: datetime,
) -> Outcome:
    """Status for one decision; Fixed scaling shows none."""
    mode = spec.scaling.mode
    if mode == "Fixed":
        return Outcome(scale.replicas, None, None)
    changed = scale.current is not None and scale.replicas != scale.current
    last = now if changed else (previous.last_scale_time if previous else None)
    if scale.limited is not None:
        message = scale.limited[1]
    elif scale.needed is not None and capacity is not None and demand is not None:
        message = (
            f"{scale.needed} replica(s) of {capacity.rate:.3g} req/s carry the peak demand "
            f"{demand:.3g} req/s with {spec.tuning.headroom:.0%} headroom"
        )
    else:
        message = None
    status = ScalingStatus(
        mode=mode,
        desired_replicas=scale.replicas,
        needed_replicas=scale.needed,
        demand=round(demand, 4) if demand is not None else None,
        capacity_per_replica=round(capacity.rate, 4) if capacity else None,
        capacity_low=capacity.low if capacity else None,
        capacity_high=capacity.high if capacity else None,
        capacity_source=capacity.source if capacity else None,
        message=message,
        last_scale_time=last,
    )
    if mode != "Capacity":
        return Outcome(scale.replicas, status, None)
    row: ConditionRow = (
        (SCALING_LIMITED, "True", scale.limited[0], scale.limited[1])
        if scale.limited is not None
        else (SCALING_LIMITED, "False", "WithinBounds", message or "")
    )
    return Outcome(scale.replicas, status, row)
