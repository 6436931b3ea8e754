"""The knob registry (`slotune.engine.vllm.rules.KNOBS`) against the API and vLLM's flag table:
a knob added to one and not the other fails here."""

from typing import Any

import pytest
from optuna.distributions import CategoricalDistribution

from slotune.engine.vllm import rules as vllm
from slotune.models import EngineArgs, SearchSpace
from slotune.tuner.space import PARAM_SHORT, PLATFORMS, Platform, default_space, describe_params


def test_every_engine_args_field_is_a_knob_and_every_knob_a_field() -> None:
    assert [k.field for k in vllm.KNOBS] == list(EngineArgs.model_fields)


def test_the_spec_spells_each_knob_as_the_registry_says() -> None:
    for knob in vllm.KNOBS:
        assert EngineArgs.model_fields[knob.field].alias == knob.spec_name


def test_a_knob_is_tunable_in_the_spec_exactly_when_some_platform_tunes_it() -> None:
    tuned = {k.field for k in vllm.KNOBS if k.search}
    assert tuned == set(SearchSpace.model_fields)


def test_every_knobs_flag_is_in_vllms_flag_table() -> None:
    known = vllm.known_flags()
    for knob in vllm.KNOBS:
        flags = {knob.flag} if knob.negative is None else {knob.flag, knob.negative}
        assert flags <= known, knob.field


def test_short_names_are_unique() -> None:
    assert len(set(PARAM_SHORT.values())) == len(vllm.KNOBS)


@pytest.mark.parametrize("platform", PLATFORMS.values(), ids=lambda p: p.name)
def test_each_platforms_defaults_are_valid_settings_inside_its_default_space(
    platform: Platform,
) -> None:
    assert vllm.check_args(platform.default_args(), platform.backend) == []  # type: ignore[arg-type]
    space = default_space(platform)
    for name, distribution in space.items():
        value: Any = platform.defaults[name]
        assert distribution._contains(distribution.to_internal_repr(value)), (name, value)


@pytest.mark.parametrize("platform", PLATFORMS.values(), ids=lambda p: p.name)
def test_the_default_space_keeps_only_values_the_backend_accepts(platform: Platform) -> None:
    for name, distribution in default_space(platform).items():
        if isinstance(distribution, CategoricalDistribution):
            assert len(distribution.choices) > 1
            for value in distribution.choices:
                assert vllm.backend_accepts(name, value, platform.backend), (name, value)


def test_a_card_that_shares_a_column_gets_its_defaults_and_space_with_its_own_spread() -> None:
    h100, h200 = PLATFORMS["h100"], PLATFORMS["h200"]
    assert h100.table == "h200"
    assert h100.defaults == h200.defaults
    assert default_space(h100) == default_space(h200)
    assert h100.spread != h200.spread


def test_trial_lines_use_the_registrys_short_names() -> None:
    line = describe_params({"max_num_batched_tokens": 384, "enable_prefix_caching": False})
    assert line == "batched=384 prefix=off"


def test_lossy_values_join_the_default_space_only_where_the_spec_allows_them() -> None:
    """fp8 weights and an fp8 KV cache change what the model computes: a study draws them only
    with tuning.quality.allowLossy (and gates each on quality); the CPU engine has no fp8
    matmul, so it never draws fp8 weights."""
    gpu = default_space(PLATFORMS["h200"])
    assert "quantization" not in gpu
    assert "kv_cache_dtype" not in gpu
    lossy = default_space(PLATFORMS["h200"], allow_lossy=True)
    assert lossy["quantization"] == CategoricalDistribution(("none", "fp8"))
    assert lossy["kv_cache_dtype"] == CategoricalDistribution(("auto", "fp8"))
    assert "quantization" not in default_space(PLATFORMS["cpu"], allow_lossy=True)


def test_new_knobs_render_as_vllm_reads_them() -> None:
    args = EngineArgs.model_validate(
        {
            "quantization": "fp8",
            "longPrefillTokenThreshold": 512,
            "speculative": {"method": "ngram", "numSpeculativeTokens": 4},
        }
    )
    assert vllm.render_tuned_args(args) == [
        "--quantization", "fp8",
        "--long-prefill-token-threshold", "512",
        "--speculative-config", '{"method":"ngram","num_speculative_tokens":4}',
    ]  # fmt: skip
    # The checkpoint's own weights render no flag: --quantization has no value for them.
    assert vllm.render_tuned_args(EngineArgs(quantization="none")) == []
