"""A request's outcome as plain data, for the attainment rule's unit tests (the load
generator's `RequestResult` has the same fields the rule reads)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Result:
    ttft: float | None
    e2e: float
    itls: list[float] = field(default_factory=list)
    output_tokens: int = 5
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)
