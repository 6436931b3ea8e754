"""The record of one trial's measurement: its capacity and the figures people read."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from slotune.measure.capacity import Capacity, Ceiling, non_negative
from slotune.measure.quality import QualityFigures, judge
from slotune.models import QualitySpec


class Measurement(BaseModel):
    """What one trial's measurement saw: its capacity (the rate search, every probe), the
    engine's ceilings where this trial measured them, and the figures of the probe at the
    target rate, which status and events show. Every figure is finite and non-negative: one
    that is not was not measured, and is refused where it is made and where it is read."""

    model_config = ConfigDict(allow_inf_nan=False)

    capacity: Capacity | None = None
    ceiling: Ceiling | None = None
    prefix_cache_reset: bool | None = Field(
        default=None, description="Whether the engine's prefix cache was reset between probes."
    )
    prefix_cache_salted: bool | None = Field(
        default=None,
        description="Whether each probe's requests carried a cache salt of their own, so that "
        "none hit blocks an earlier probe cached (vLLM's cache_salt).",
    )
    slo_percentiles: dict[str, float | None] = Field(
        default_factory=dict,
        description="Each SLO metric at its target percentile at the target rate, seconds.",
    )
    ttft_p95: float | None = None
    tpot_p95: float | None = None
    itl_p95: float | None = None
    e2e_p95: float | None = None
    request_throughput: float = 0.0
    output_throughput: float = 0.0
    completed: int = 0
    failed: int = 0
    send_rate: float = 0.0
    scheduling_lag_p99: float | None = None
    quality: QualityFigures | None = Field(
        default=None,
        description="A lossy configuration against the reference (the quality gate).",
    )
    quality_refused: str | None = Field(
        default=None,
        description="Why the configuration failed the quality gate: it is infeasible, whatever "
        "its capacity.",
    )
    spec_decode_acceptance: float | None = Field(
        default=None,
        description="With speculative decoding: accepted draft tokens over proposed ones, "
        "over the capacity search.",
    )

    def gated(self, figures: QualityFigures, bounds: QualitySpec) -> Measurement:
        """This measurement with the quality gate's figures and verdict."""
        return self.model_copy(
            update={"quality": figures, "quality_refused": judge(figures, bounds)}
        )

    @model_validator(mode="after")
    def _measured(self) -> Measurement:
        non_negative(self)
        return self

    @property
    def capacity_rate(self) -> float:
        """Requests/s carried within every SLO target (0 when not even the lowest rate was)."""
        return self.capacity.rate if self.capacity is not None else 0.0
