"""The load Job's argument contract end to end, for every engine: the Job `render` writes is
read back by `slotune trial-load`, and the measurement reaches the adapter of the engine the
trial runs (its metric names and patterns), not vLLM's by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slotune import render
from slotune.engine import ENGINES, engine_for
from slotune.measure import probe
from slotune.measure.capacity import Ceiling, MeasureRequest
from slotune.measure.loadjob import LoadArgs
from slotune.measure.record import Measurement
from slotune.spec import parse_spec

OWNER = render.Owner(name="chat", namespace="llm", uid="1234")
IMAGES = {"vllm": "vllm/vllm-openai:v0.32.0", "sglang": "lmsysorg/sglang:v0.5.5"}
REQUEST = MeasureRequest(
    seed=3,
    target_rate=2.5,
    measure_ceiling=True,
    ceiling=Ceiling(prefill_tps=9000.0, decode_tps=400.0, decode_concurrency=64, prompt_tokens=512),
    precise=True,
    spread=0.053,
)


def load_args_of(kind: str, quality: dict[str, Any] | None = None) -> tuple[list[str], Any]:
    """The arguments of a trial's load Job as `render` writes them; with `quality`, a lossy
    trial's, gated against the serving Service."""
    tuning: dict[str, Any] = {"enabled": True, "workload": {"requestRate": 2, "duration": "20s"}}
    if quality is not None:
        tuning["quality"] = quality
    spec, problems = parse_spec(
        {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "chat"},
            "engine": {"kind": kind, "image": IMAGES[kind]},
            "slo": {"ttft": {"percentile": 95, "maxSeconds": 2.0}},
            "tuning": tuning,
        }
    )
    assert spec is not None, problems
    job = render.render_load_job(
        OWNER,
        spec,
        image="slotune/operator:1",
        url="http://10.0.0.9:8000",
        workload=spec.tuning.workload,
        request=REQUEST,
        study=1,
        trial=2,
        gated=quality is not None,
        reference_url=render.service_url(OWNER, spec) if quality is not None else None,
    )
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container.get("command", []) + container.get("args", [])
    assert command[:2] == ["slotune", "trial-load"]
    return command[2:], spec


def test_every_engine_has_an_image_here() -> None:
    assert set(IMAGES) == set(ENGINES)


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_the_job_says_what_trial_load_reads(kind: str) -> None:
    argv, spec = load_args_of(kind)
    args = LoadArgs.parse(argv)
    assert args.engine == kind
    assert args.model == "chat"
    assert args.url == "http://10.0.0.9:8000"
    assert args.request == REQUEST
    assert args.workload == spec.tuning.workload
    assert args.slo == spec.slo
    assert args.spec().engine.kind == kind
    assert LoadArgs.parse(args.argv()) == args


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_trial_load_measures_with_the_trials_engine(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, _ = load_args_of(kind)
    result = tmp_path / "termination-log"
    argv[argv.index("--result-file") + 1] = str(result)
    reached: list[str] = []

    def measured(self: probe.CapacityMeasure, url: str, request: MeasureRequest) -> Measurement:
        reached.append(self.adapter.kind)
        assert request == REQUEST
        return Measurement()

    monkeypatch.setattr(probe.CapacityMeasure, "__call__", measured)
    assert probe.trial_load_main(argv) == 0
    assert reached == [kind]
    assert engine_for(kind).kind == kind
    assert Measurement.model_validate_json(result.read_text()) == Measurement()


def test_a_gated_job_carries_the_bounds_and_the_reference() -> None:
    """A lossy trial's Job gates its quality against the serving Service after measuring; the
    bounds and the reference travel in the same contract."""
    argv, spec = load_args_of("vllm", {"allowLossy": True, "maxMeanKL": 0.02, "prompts": 4})
    args = LoadArgs.parse(argv)
    assert args.quality == spec.tuning.quality
    assert args.quality.max_mean_kl == 0.02
    assert args.reference_url == "http://chat.llm.svc:8000"
    assert LoadArgs.parse(args.argv()) == args


def test_a_gated_job_without_a_reference_refuses_the_configuration() -> None:
    """Strategy InPlace measures the serving pods themselves, and a lossy serving configuration
    is no reference: the Job is rendered without one, and refuses."""
    args = LoadArgs.parse(
        ["--url", "http://10.0.0.9:8000", "--model", "chat", "--workload", "{}",
         "--slo", '{"ttft": {"maxSeconds": 2}}', "--target-rate", "2", "--quality", "{}"]
    )  # fmt: skip
    gated = probe.gate_in_job(args, Measurement())
    assert gated.quality_refused is not None
    assert "no lossless reference engine" in gated.quality_refused
