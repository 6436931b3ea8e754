"""The one factory of `LLMDeploymentSpec`s for tests: a spec is a dict the API validates, and
each test file states only what its cases need beside these defaults."""

from __future__ import annotations

from typing import Any

from slotune.models import LLMDeploymentSpec

SLO: dict[str, Any] = {"ttft": {"maxSeconds": 2.0}, "tpot": {"maxSeconds": 0.05}}
"""TTFT p95 within 2 s and TPOT p95 within 50 ms."""


def llm_spec(**fields: Any) -> LLMDeploymentSpec:
    """A spec serving the model `tiny` under `SLO`; each of `fields` (the API's names) replaces
    that top-level field whole."""
    return LLMDeploymentSpec.model_validate({"model": {"name": "tiny"}, "slo": SLO, **fields})


def workload(prompt: int = 1024, rate: float = 2, output: int = 32, **more: Any) -> dict[str, Any]:
    """A synthetic workload: `prompt`-token prompts, `output` tokens each, at `rate` requests/s."""
    return {
        "source": "Synthetic",
        "promptTokens": {"mean": prompt},
        "outputTokens": {"mean": output},
        "requestRate": rate,
        **more,
    }


def tuning(load: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """`spec.tuning` enabled, over `load` (`workload()` when None), with `fields` beside it."""
    return {"enabled": True, "workload": workload() if load is None else load, **fields}
