"""The vLLM rule table, from plain data: what slotune refuses before anything is launched."""

import pytest

from slotune.engine.vllm import rules as vllm
from slotune.engine.vllm import tables
from slotune.models import EngineArgs
from slotune.spec import parse_spec


def messages(problems: list[vllm.Violation]) -> str:
    return " | ".join(str(p) for p in problems)


@pytest.mark.parametrize(
    ("args", "backend", "fragment"),
    [
        (EngineArgs(block_size=8), "FLASH_ATTN", "blockSize: 8 is not valid on FLASH_ATTN"),
        (EngineArgs(block_size=24), "TRITON_ATTN", "must be a multiple of 16"),
        (EngineArgs(block_size=16), "CPU_ATTN", "must be a multiple of 32"),
        (EngineArgs(block_size=128), "FLASHINFER", "must be one of 16, 32, 64"),
        (EngineArgs(kv_cache_dtype="nvfp4"), "FLASH_ATTN", "nvfp4 is not supported by FLASH_ATTN"),
    ],
)
def test_invalid_typed_settings_are_named(args: EngineArgs, backend: str, fragment: str) -> None:
    assert fragment in messages(vllm.check_args(args, backend))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "backend"),
    [
        (EngineArgs(block_size=16), "FLASH_ATTN"),
        (EngineArgs(block_size=64), "FLASH_ATTN"),
        (EngineArgs(block_size=128), "CPU_ATTN"),
        (EngineArgs(block_size=32), "FLASHINFER"),
        (EngineArgs(kv_cache_dtype="fp8"), "FLASH_ATTN"),
        (EngineArgs(max_num_batched_tokens=256, max_num_seqs=256), "FLASH_ATTN"),
        (EngineArgs(), "FLASH_ATTN"),
    ],
)
def test_valid_typed_settings_pass(args: EngineArgs, backend: str) -> None:
    assert vllm.check_args(args, backend) == []  # type: ignore[arg-type]


def test_batched_tokens_below_seqs_is_refused() -> None:
    # The model refuses it on its own; the rule table refuses it for configurations that a
    # tuner builds without going through the model validator.
    with pytest.raises(ValueError, match="at least maxNumSeqs"):
        EngineArgs(max_num_batched_tokens=128, max_num_seqs=256)
    built = EngineArgs.model_construct(max_num_batched_tokens=128, max_num_seqs=256)
    assert "max-num-batched-tokens >= max-num-seqs" in messages(
        vllm.check_args(built, "FLASH_ATTN")
    )


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--chunked-prefill-size", "4096"], "that is SGLang's flag"),
        (["--chunked-prefill-size=4096"], "--max-num-batched-tokens"),
        (["--swap-space", "4"], "--kv-offloading-size"),
        (["--tokenizer-pool-size", "4"], "--renderer-num-workers"),
        (["--max-num-partial-prefills", "2"], "use spec.engine.args.longPrefillTokenThreshold"),
        (["--max-num-batched-tokens", "4096"], "set spec.engine.args.maxNumBatchedTokens"),
        (["--max_num_seqs", "64"], "set spec.engine.args.maxNumSeqs"),
        (["--no-enable-prefix-caching"], "set spec.engine.args.enablePrefixCaching"),
        (["--device-memory-utilization", "0.8"], "spec.engine.args.gpuMemoryUtilization"),
        (["--port", "9000"], "managed by slotune"),
        (["--disable-log-stats"], "switches off every vllm:* metric"),
        (["--enable-expert"], "vLLM would silently read it as --enable-expert-parallel"),
        (["--long-prefill"], "not a full vLLM flag name"),
        (["--max-num-batchd-tokens", "8"], "is not a flag of vLLM 0.32.0"),
        (["llama"], "is a value with no flag before it"),
    ],
)
def test_extra_args_problems_name_the_fix(extra: list[str], fragment: str) -> None:
    assert fragment in messages(vllm.check_extra_args(extra))


@pytest.mark.parametrize(
    "extra",
    [
        ["--stream-interval", "2"],
        ["--enable-chunked-prefill"],
        ["-O0"],
        ["-O", "3"],
        ["-cc.mode=3"],
        ["--compilation-config", '{"mode": 3}'],
        ["--max-num-queued-reqs", "64", "--scheduling-policy", "priority"],
        ["--seed", "-1"],
    ],
)
def test_real_flags_pass(extra: list[str]) -> None:
    assert vllm.check_extra_args(extra) == []


def test_flag_table_comes_from_the_real_parser() -> None:
    flags = vllm.known_flags()
    assert "--max-num-batched-tokens" in flags
    assert "--swap-space" not in flags
    assert "--chunked-prefill-size" not in flags


def test_disabling_chunked_prefill_needs_budget_for_a_whole_sequence() -> None:
    args = EngineArgs(max_num_batched_tokens=2048, max_model_len=8192)
    problems = vllm.check_config(args, ["--no-enable-chunked-prefill"], "FLASH_ATTN")
    assert "at least maxModelLen (8192)" in messages(problems)
    assert vllm.check_config(args, [], "FLASH_ATTN") == []


def test_tuned_args_render_with_full_names_in_stable_order() -> None:
    args = EngineArgs(
        kv_cache_dtype="fp8",
        enable_prefix_caching=False,
        max_num_seqs=64,
        gpu_memory_utilization=0.85,
        block_size=32,
        max_num_batched_tokens=4096,
    )
    assert vllm.render_tuned_args(args) == [
        "--max-num-batched-tokens",
        "4096",
        "--block-size",
        "32",
        "--gpu-memory-utilization",
        "0.85",
        "--max-num-seqs",
        "64",
        "--no-enable-prefix-caching",
        "--kv-cache-dtype",
        "fp8",
    ]


def test_unset_settings_are_left_to_vllm() -> None:
    assert vllm.render_tuned_args(EngineArgs()) == []


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.32.0", "0.32.0"),
        ("registry.local:5000/vllm/vllm-openai:v0.32.0-cu130", "0.32.0"),
        ("vllm/vllm-openai:latest", vllm.PINNED_VERSION),
        ("registry.local:5000/vllm", vllm.PINNED_VERSION),
    ],
)
def test_flag_table_version_follows_the_image_tag(image: str, version: str) -> None:
    assert tables.version_of_image(image) == version


def test_a_typographic_dash_is_named_and_the_flag_meant_is_checked() -> None:
    problems = messages(vllm.check_extra_args(["\u2014swap-space", "4", "\u2013enforce-eager"]))
    assert "'\u2014swap-space' starts with a typographic dash (EM DASH)" in problems
    assert "write '--swap-space'" in problems
    assert "(EN DASH)" in problems
    assert "write '--enforce-eager'" in problems
    assert "--swap-space does not exist in vLLM" in problems  # what the ASCII flag would hit
    assert "is a value with no flag before it" not in problems


def test_a_typographic_dash_beside_a_hyphen_gets_the_two_dashes_back() -> None:
    """A non-breaking hyphen then a hyphen (what some editors make of `--`): the fix is
    `--swap-space`, not `---swap-space`."""
    problems = messages(vllm.check_extra_args(["\u2011-swap-space", "4", "-\u2013seed", "1"]))
    assert "(NON-BREAKING HYPHEN)" in problems
    assert "write '--swap-space'" in problems
    assert "write '--seed'" in problems
    assert "---" not in problems


def test_parallelism_the_pods_gpus_cannot_hold_is_refused() -> None:
    found = messages(
        vllm.check_resources(
            ["-pp", "2", "--data-parallel-size=2"], 1, "vllm/vllm-openai:v0.32.0", "FLASH_ATTN"
        )
    )
    assert "spec.engine.extraArgs[0]: -pp 2 needs 2x the GPUs" in found
    assert "spec.engine.extraArgs[2]: --data-parallel-size 2 needs 2x the GPUs" in found
    assert vllm.check_resources(["-pp", "1"], 2, "vllm/vllm-openai:v0.32.0", "FLASH_ATTN") == []


def test_the_gpu_build_on_a_pod_without_a_gpu_is_refused_unless_a_cpu_engine_is_named() -> None:
    gpu_image = "vllm/vllm-openai:v0.32.0"
    assert "spec.resources.gpus: 0 GPUs with vllm/vllm-openai:v0.32.0" in messages(
        vllm.check_resources([], 0, gpu_image, "FLASH_ATTN")
    )
    assert vllm.check_resources([], 0, gpu_image, "CPU_ATTN") == []
    assert vllm.check_resources([], 0, "example.com/vllm-cpu:v0.32.0", "FLASH_ATTN") == []
    assert vllm.check_resources([], 1, gpu_image, "FLASH_ATTN") == []


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--stream-interval"], "--stream-interval takes a value"),
        (["--seed", "--pipeline-parallel-size", "1"], "--seed takes a value, but"),
        (["--enforce-eager", "true"], "is a switch and takes no value, but is given 'true'"),
        (["--enforce-eager=false"], "to turn it off write --no-enforce-eager"),
        (["--max-num-queued-reqs", "64", "128"], "'128' is a value with no flag before it"),
    ],
)
def test_values_are_counted_as_vllms_parser_counts_them(extra: list[str], fragment: str) -> None:
    problems = vllm.check_extra_args(extra)
    assert fragment in messages(problems)
    assert len(problems) == 1, problems  # one mistake, one problem


def test_the_flag_table_knows_how_many_values_each_flag_takes() -> None:
    arity = vllm.flag_arity()
    assert arity["--enforce-eager"] == "0"
    assert arity["--max-num-seqs"] == "1"
    assert arity["--ignore-patterns"] == "+"
    # Several values where the parser takes several: not a stray value.
    assert vllm.check_extra_args(["--ignore-patterns", "a", "b"]) == []


def test_an_image_without_a_flag_table_is_named_and_checked_against_the_pinned_one() -> None:
    assert tables.flag_table_note("vllm/vllm-openai:v0.32.0") == ""
    note = tables.flag_table_note("vllm/vllm-openai:v0.33.0")
    assert "checked against vLLM 0.32.0's parser" in note
    assert "no flag table for vLLM 0.33.0" in note
    assert "no flag table for vLLM of 'vllm/vllm-openai:latest'" in tables.flag_table_note(
        "vllm/vllm-openai:latest"
    )


@pytest.mark.parametrize(
    ("where", "value", "fragment"),
    [
        (
            {"engine": {"args": {"kvCacheDtype": "int4"}}},
            "int4",
            "spec.engine.args.kvCacheDtype: 'int4' is not a KV-cache dtype of vLLM's; "
            "nearest: int4_per_token_head (on TRITON_ATTN)",
        ),
        (
            {"tuning": {"searchSpace": {"kvCacheDtype": ["auto", "FP8"]}}},
            "FP8",
            "spec.tuning.searchSpace.kvCacheDtype.1: 'FP8' is not a KV-cache dtype of vLLM's; "
            "nearest: fp8 (on FLASH_ATTN, FLASHINFER, TRITON_ATTN, CPU_ATTN)",
        ),
    ],
)
def test_an_unknown_kv_cache_dtype_gets_the_nearest_real_one_and_its_backends(
    where: dict[str, object], value: str, fragment: str
) -> None:
    spec, problems = parse_spec({"model": {"name": "m"}, **where})
    assert spec is None
    assert any(p.startswith(fragment) for p in problems), problems


def test_a_spec_larger_than_slotune_serves_is_refused_with_its_size_and_largest_part() -> None:
    affinity = {"nodeAffinity": {"note": "x" * (70 * 1024)}}
    spec, problems = parse_spec({"model": {"name": "m"}, "scheduling": {"affinity": affinity}})
    assert spec is None
    assert problems == [
        "spec: 70 KiB, more than slotune serves (64 KiB); its largest part is spec.scheduling"
    ]
    near = {"nodeAffinity": {"note": "x" * (60 * 1024)}}
    assert parse_spec({"model": {"name": "m"}, "scheduling": {"affinity": near}})[1] == []


@pytest.mark.parametrize(
    "engine",
    [
        {"extraArgs": ["--api-key", "s3cret"]},
        {"extraArgs": ["--api-key=s3cret"]},
        {"env": [{"name": "VLLM_API_KEY", "value": "s3cret"}]},
    ],
)
def test_an_api_key_in_plain_text_is_refused_with_where_it_belongs(
    engine: dict[str, object],
) -> None:
    _, problems = parse_spec({"model": {"name": "m"}, "engine": engine})
    assert len(problems) == 1, problems
    assert "put it in a Secret and name it in spec.engine.apiKeySecretRef" in problems[0] or (
        "name it in engine.apiKeySecretRef" in problems[0]
    )


@pytest.mark.parametrize(
    ("extra_args", "expected"),
    [
        (["--seed", "abc"], "--seed takes an integer, not 'abc'"),
        (["--seed="], "--seed takes an integer, not ''"),
        (["-q", "1.5"], "'1.5' is not a value -q takes"),
        (["--quantization", "fp9"], "'fp9' is not a value --quantization takes; did you mean fp8?"),
    ],
)
def test_a_value_the_parser_would_refuse_is_named(extra_args: list[str], expected: str) -> None:
    """Types and choices from the dumped parser: what vLLM would exit on at start-up."""
    assert expected in messages(vllm.check_extra_args(extra_args))


def test_values_the_parser_takes_pass() -> None:
    assert vllm.check_extra_args(["--seed", "7", "--scheduling-policy", "priority"]) == []


def test_fp8_weights_are_refused_where_there_is_no_fp8_matmul() -> None:
    """vLLM's CPU build starts `--quantization fp8` and fails in _C::static_scaled_fp8_quant
    (seen on vllm-cpu 0.32.0): the rule refuses it before launch."""
    fp8 = EngineArgs(quantization="fp8")
    assert "need a GPU with fp8 units" in messages(vllm.check_args(fp8, "CPU_ATTN"))
    assert vllm.check_args(fp8, "FLASH_ATTN") == []


def test_the_prefill_cap_stays_within_the_context() -> None:
    args = EngineArgs(long_prefill_token_threshold=4096, max_model_len=2048)
    assert "above maxModelLen 2048" in messages(vllm.check_args(args, "FLASH_ATTN"))


def test_typed_settings_are_checked_against_the_images_flag_table() -> None:
    """The speculative config and the prefill cap are flags of the pinned vLLM; a method of
    --quantization its parser does not list is named with the table's own values."""
    args = EngineArgs.model_validate(
        {
            "quantization": "fp8",
            "longPrefillTokenThreshold": 512,
            "speculative": {"method": "ngram", "numSpeculativeTokens": 4},
        }
    )
    assert vllm.check_version(args, vllm.PINNED_VERSION) == []


def test_a_typed_setting_is_checked_against_the_table_of_the_images_release() -> None:
    """ultraquant_4bit came to --kv-cache-dtype in 0.32.0: the 0.31.0 table refuses it. The
    lossy knobs' flags are in every table kept (the GPU study's CUDA 0.24.0 included)."""
    args = EngineArgs(kv_cache_dtype="ultraquant_4bit")
    assert vllm.check_version(args, "0.32.0") == []
    assert "is not a value --kv-cache-dtype takes" in messages(vllm.check_version(args, "0.31.0"))
    lossy = EngineArgs.model_validate(
        {"quantization": "fp8", "kvCacheDtype": "fp8",
         "speculative": {"method": "ngram", "numSpeculativeTokens": 4}}
    )  # fmt: skip
    for version in ("0.24.0", "0.31.0", "0.32.0"):
        assert vllm.check_version(lossy, version) == [], version
