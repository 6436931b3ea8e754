"""The quality gate's arithmetic (`slotune.measure.quality`): KL over the reference's top tokens
and a tail bucket, top-token agreement, and the verdict against the spec's bounds. The gate
against real engines is tests/engine/test_quality_gate.py."""

import math
from pathlib import Path

import pytest
from tests.support.specs import llm_spec, tuning

from slotune.engine import ENGINES
from slotune.measure import quality, scoring
from slotune.measure.probe import acceptance_rate
from slotune.measure.record import Measurement
from slotune.models import QualitySpec
from slotune.study import trials
from slotune.tuner.gate import StudyGate
from slotune.tuner.records import TrialRecord, TrialState


def dist(probabilities: dict[int, float]) -> quality.NextToken:
    return quality.NextToken({token: math.log(p) for token, p in probabilities.items()})


def test_a_distribution_is_no_distance_from_itself() -> None:
    same = dist({1: 0.6, 2: 0.3, 3: 0.05})
    assert quality.kl_divergence(same, same) == pytest.approx(0.0, abs=1e-12)


def test_kl_is_exact_when_the_top_tokens_hold_all_the_mass() -> None:
    p = {1: 0.5, 2: 0.5}
    q = {1: 0.9, 2: 0.1}
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert quality.kl_divergence(dist(p), dist(q)) == pytest.approx(expected)


def test_the_tail_is_one_bucket_and_a_missing_token_is_taken_at_the_kth_probability() -> None:
    """Token 3 is outside the candidate's top tokens: it is taken at the candidate's smallest
    listed probability (0.1), and the rest of each distribution is one bucket."""
    p = {1: 0.5, 2: 0.2, 3: 0.2}  # tail 0.1
    q = {1: 0.5, 2: 0.3, 4: 0.1}
    q3 = 0.1
    q_tail = 1 - (0.5 + 0.3 + q3)
    expected = (
        0.5 * math.log(0.5 / 0.5)
        + 0.2 * math.log(0.2 / 0.3)
        + 0.2 * math.log(0.2 / q3)
        + 0.1 * math.log(0.1 / q_tail)
    )
    assert quality.kl_divergence(dist(p), dist(q)) == pytest.approx(expected)


def test_compare_counts_agreement_and_the_kl_percentiles() -> None:
    ref = [[dist({1: 0.9, 2: 0.1}), dist({1: 0.6, 2: 0.4})]]
    cand = [[dist({1: 0.9, 2: 0.1}), dist({1: 0.4, 2: 0.6})]]
    figures = quality.compare(ref, cand)
    assert figures.agreement == 0.5
    assert figures.positions == 2
    assert figures.sequences == 1
    flipped = 0.6 * math.log(0.6 / 0.4) + 0.4 * math.log(0.4 / 0.6)
    assert figures.mean_kl == pytest.approx(flipped / 2)
    assert figures.p99_kl == pytest.approx(0.99 * flipped)


def test_sequences_scored_differently_are_an_error_not_a_figure() -> None:
    one = [[dist({1: 1.0})]]
    with pytest.raises(ValueError, match="sequence scored at 2 positions"):
        quality.compare(one, [[dist({1: 1.0}), dist({1: 1.0})]])
    with pytest.raises(ValueError, match="2 scored sequences against 1"):
        quality.compare(one, one + one)


def test_the_verdict_names_every_broken_bound() -> None:
    bounds = QualitySpec(max_mean_kl=0.01, max_p99_kl=0.2, min_agreement=0.9)
    good = quality.QualityFigures(
        mean_kl=0.005, p99_kl=0.1, agreement=0.95, positions=10, sequences=1
    )
    assert quality.judge(good, bounds) is None
    bad = good.model_copy(update={"mean_kl": 0.12, "agreement": 0.78})
    verdict = quality.judge(bad, bounds)
    assert verdict == "quality gate: mean KL 0.12 > 0.01; top-token agreement 0.780 < 0.9"


def test_prompt_logprobs_keep_the_top_k_only() -> None:
    """vLLM lists the actual prompt token at its own rank beside the top-k."""
    entry = {
        "17": {"logprob": -9.5, "rank": 14278, "decoded_token": None},
        "5": {"logprob": -0.1, "rank": 1, "decoded_token": None},
        "6": {"logprob": -2.5, "rank": 2, "decoded_token": None},
    }
    assert scoring._next_token(entry).top == {5: -0.1, 6: -2.5}


def test_prompts_are_seeded_and_in_the_workloads_shape() -> None:
    bounds = QualitySpec(prompts=3)
    first = scoring.prompts(bounds, prompt_tokens=50, shared_prefix_ratio=0.5, seed=4)
    assert first == scoring.prompts(bounds, prompt_tokens=50, shared_prefix_ratio=0.5, seed=4)
    assert [len(p) for p in first] == [50, 50, 50]
    assert first[0][:25] == first[1][:25]


def test_acceptance_is_accepted_over_proposed_draft_tokens_between_two_readings() -> None:
    assert acceptance_rate((100.0, 40.0), (1100.0, 640.0)) == 0.6
    assert acceptance_rate((0.0, 0.0), (0.0, 0.0)) is None  # nothing proposed: no speculation
    assert acceptance_rate(None, (10.0, 5.0)) is None  # the engine has no such counters


def test_broken_numbers_fail_the_gate_instead_of_crashing_it() -> None:
    """A candidate whose log-probabilities are NaN or -inf is what the gate exists to refuse:
    such a position counts as the largest KL and a disagreement."""
    ref = [[dist({1: 0.9, 2: 0.1}), dist({1: 0.9, 2: 0.1})]]
    broken = [
        [quality.NextToken({1: math.nan, 2: -1.0}), quality.NextToken({1: -math.inf, 2: 0.0})]
    ]
    figures = quality.compare(ref, broken)
    assert figures.mean_kl == quality.BROKEN_KL
    assert figures.agreement == 0.0
    assert quality.judge(figures, QualitySpec()) is not None


def test_a_reference_is_written_whole_and_read_back_with_what_it_was_taken_for(
    tmp_path: Path,
) -> None:
    reference = scoring.Reference(
        [[5, 6, 7]], [[dist({6: 0.7, 9: 0.3}), dist({7: 0.5, 1: 0.5})]], {"model": "m", "seed": 1}
    )
    path = tmp_path / "quality-reference.json"
    reference.save(path)
    assert not (tmp_path / "quality-reference.json.partial").exists()
    again = scoring.Reference.from_json(path.read_text())
    assert again.key == {"model": "m", "seed": 1}
    assert quality.compare(reference.scores, again.scores).mean_kl == pytest.approx(0, abs=1e-9)


def test_a_kept_reference_taken_for_another_study_is_not_used(tmp_path: Path) -> None:
    """tune --local keeps its reference beside the records; another model, other prompts or
    another workload shape in the same folder need another reference."""
    spec = llm_spec(tuning=tuning(quality={"allowLossy": True}))
    path = tmp_path / "quality-reference.json"
    scoring.Reference([[1, 2]], [[dist({2: 1.0})]], {"model": "another"}).save(path)
    gate = StudyGate(spec, ENGINES["vllm"], "tiny", path)
    assert gate.reference is None
    lossy = gate.after(None, {"kv_cache_dtype": "fp8"}, "http://127.0.0.1:9", Measurement())
    assert lossy.quality_refused is not None
    assert lossy.quality_refused.startswith("quality gate: no reference")
    # A lossless trial is not gated at all: nothing is asked of its engine.
    assert gate.after(None, {"kv_cache_dtype": "auto"}, "http://127.0.0.1:9", Measurement()) == (
        Measurement()
    )


def test_a_gate_that_cannot_score_refuses_and_keeps_the_capacity(tmp_path: Path) -> None:
    """Nothing listens on the reference's port: the defaults' trial keeps its measurement, and
    every lossy trial is refused with the reason, instead of the study ending in a traceback."""
    spec = llm_spec(tuning=tuning(quality={"allowLossy": True}))
    gate = StudyGate(spec, ENGINES["vllm"], "tiny", tmp_path / "quality-reference.json")
    measured = Measurement(completed=7)
    closed = "http://127.0.0.1:9"
    assert gate.after("vllm-defaults", {}, closed, measured) == measured
    refused = gate.after(None, {"quantization": "fp8"}, closed, measured)
    assert refused.completed == 7
    assert refused.quality_refused is not None
    assert "could not score" in refused.quality_refused


def test_status_shows_a_trials_quality_and_acceptance() -> None:
    """What on-call reads in status.tuning.trials: the gate's figures beside the capacity, the
    refusal as the cause, and speculative decoding's acceptance."""
    figures = quality.QualityFigures(
        mean_kl=0.12, p99_kl=0.6, agreement=0.781, positions=4336, sequences=16
    )
    measured = Measurement(spec_decode_acceptance=0.62).gated(figures, QualitySpec())
    record = TrialRecord(
        number=3,
        params={"kv_cache_dtype": "fp8"},
        state=TrialState.MEASURED,
        measurement=measured,
        cause=measured.quality_refused,
    )
    summary = trials.shown(record)
    assert summary.quality == (
        "KL mean 0.12, p99 0.6 nats; top token agrees at 78.1% of 4336 positions"
    )
    assert summary.spec_decode_acceptance == 0.62
    assert summary.cause is not None
    assert summary.cause.startswith("quality gate: mean KL 0.12 > 0.01")
