"""Optuna, configured for SLO tuning: the SLO terms are constraints (not penalties), a failed
start is an infeasible observation, the study is seeded and deterministic, and it can be
rebuilt from trial records."""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.trial import TrialState

from slotune.measure.record import Measurement
from slotune.models import SloSpec
from slotune.tuner.records import TrialRecord
from slotune.tuner.space import Space

# A failed or rejected configuration violates the constraint by this much: far worse than any
# measured capacity (whose violation is at most 1), so the sampler learns to avoid the region.
INFEASIBLE = 10.0
CONSTRAINTS_ATTR = "constraints"


def capacity_constraints(measurement: Measurement) -> list[float]:
    """One value, (target - capacity) / target, with the target rate the measurement was
    asked to carry: feasible when it is <= 0, and larger the further capacity falls short."""
    if measurement.capacity is None:
        return infeasible_constraints()
    found = measurement.capacity
    shortfall = (found.target_rate - found.rate) / found.target_rate
    # The measurement's own verdict at the target decides the sign: an estimate a little
    # above the target whose interval still holds it is not feasible.
    return [min(shortfall, 0.0) if found.feasible else max(shortfall, 1e-6)]


def infeasible_constraints() -> list[float]:
    return [INFEASIBLE]


QUALITY_REFUSED = 1.0
"""How far a configuration that failed the quality gate violates the constraint: a measured
capacity, but one that cannot win."""


def refused_constraints(constraints: list[float]) -> list[float]:
    return [max(c, QUALITY_REFUSED) for c in constraints]


CONSTRAINT_NAMES = ["capacity"]


def create_study(
    seed: int,
    *,
    storage: str | None = None,
    name: str | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
) -> optuna.Study:
    """A maximising study with a seeded TPE sampler; constraints come with each trial
    (`Trial.set_constraint`, Optuna 5's successor of `constraints_func`), and the sampler
    prefers the feasible region they describe."""
    if sampler is None:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True)
    return optuna.create_study(
        direction="maximize",
        sampler=sampler,
        storage=storage,
        study_name=name,
        load_if_exists=storage is not None,
    )


def tell(study: optuna.Study, trial: optuna.Trial, record: TrialRecord, slo: SloSpec) -> None:
    for name, value in zip(CONSTRAINT_NAMES, record.constraints, strict=True):
        trial.set_constraint(name, value)
    trial.set_user_attr(CONSTRAINTS_ATTR, record.constraints)
    trial.set_user_attr("state", str(record.state))
    if record.cause:
        trial.set_user_attr("cause", record.cause)
    study.tell(trial, record.score)


def rebuild(study: optuna.Study, space: Space, slo: SloSpec, records: Sequence[TrialRecord]) -> int:
    """Adds the screening records the study does not hold yet; returns how many it added."""
    known = len(study.get_trials(deepcopy=False))
    screening = [r for r in records if r.phase == "screen"]
    added = 0
    for record in screening[known:]:
        if len(record.constraints) != len(CONSTRAINT_NAMES):
            raise ValueError(
                f"trial {record.number} was recorded by an older slotune (one constraint per SLO "
                "target, no capacity): start a new study in another folder"
            )
        params = {k: v for k, v in record.params.items() if k in space}
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.COMPLETE,
                value=record.score,
                params=params,
                distributions={k: space[k] for k in params},
                user_attrs={CONSTRAINTS_ATTR: record.constraints, "state": str(record.state)},
                constraints=dict(zip(CONSTRAINT_NAMES, record.constraints, strict=True)),
            )
        )
        added += 1
    return added
