"""Trial records: what each trial ran, measured, and why it failed.

They are the study's memory. Appended one JSON line per trial (locally) or kept in the
API (in the cluster), they are enough to rebuild the Optuna study after a restart and carry
on where it stopped, and they are what the report and the benchmark read.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slotune.measure.capacity import Capacity, Ceiling
from slotune.measure.record import Measurement


class TrialState(StrEnum):
    MEASURED = "Measured"  # the engine started and was measured (feasible or not)
    REJECTED = "Rejected"  # broke a known rule: never launched
    FAILED = "Failed"  # launched, but did not become a healthy engine


class TrialRecord(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # NaN would be stored as null

    number: int
    phase: Literal["screen", "finalist"] = "screen"
    label: str | None = Field(default=None, description="e.g. vllm-defaults, current")
    params: dict[str, Any]
    state: TrialState
    cause: str | None = None
    failure_kind: str | None = None
    facts: dict[str, Any] | None = None
    measurement: Measurement | None = None
    score: float = 0.0
    constraints: list[float] = Field(default_factory=list)
    feasible: bool = False
    seconds: float = 0.0
    of_trial: int | None = Field(default=None, description="For a finalist: the trial re-measured.")

    @property
    def launched(self) -> bool:
        return self.state != TrialState.REJECTED


def record_capacity(record: TrialRecord) -> Capacity | None:
    """The capacity a trial measured, if it measured one."""
    return record.measurement.capacity if record.measurement else None


def study_ceiling(records: list[TrialRecord]) -> Ceiling | None:
    """The engine's ceilings as the study measured them (once, on vLLM's defaults)."""
    found = (r.measurement.ceiling for r in records if r.measurement is not None)
    return next((c for c in found if c is not None), None)


class Store(Protocol):
    """Where a study keeps its records: a file locally, a ConfigMap in the cluster."""

    def load(self) -> list[TrialRecord]: ...

    def append(self, record: TrialRecord) -> None: ...


class MemoryStore:
    """Records held in memory; `added` is what a caller still has to persist."""

    def __init__(self, records: list[TrialRecord] | None = None) -> None:
        self.records = list(records or [])
        self.added: list[TrialRecord] = []

    def load(self) -> list[TrialRecord]:
        return list(self.records)

    def append(self, record: TrialRecord) -> None:
        self.records.append(record)
        self.added.append(record)


def dumps(records: list[TrialRecord]) -> str:
    """Records as JSON lines."""
    return "".join(record.model_dump_json() + "\n" for record in records)


def loads(text: str) -> list[TrialRecord]:
    """Records from JSON lines; raises on a line that is not one (a file slotune wrote)."""
    return [TrialRecord.model_validate_json(line) for line in text.splitlines() if line.strip()]


def loads_readable(text: str) -> tuple[list[TrialRecord], list[tuple[str, str]]]:
    """The records that load, and the lines that do not with why each does not (records kept
    where others can edit them: one bad line must not stop the study or the serving beside
    it)."""
    records: list[TrialRecord] = []
    unreadable: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(TrialRecord.model_validate_json(line))
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the line"
            unreadable.append((line, f"line {number}: {where}: {first['msg']}"))
    return records, unreadable


class RecordStore:
    """An append-only JSON-lines file of trial records."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[TrialRecord]:
        if not self.path.exists():
            return []
        return loads(self.path.read_text())

    def append(self, record: TrialRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(record.model_dump_json() + "\n")
