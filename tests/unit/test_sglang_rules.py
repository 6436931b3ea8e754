"""SGLang's flag rules from its real flag tables (dumped from `ServerArgs.add_cli_args` of SGLang
0.5.5 and 0.5.23, no fakes): what slotune refuses in an SGLang spec's extraArgs before anything
is launched, read as SGLang's plain argparse parser reads it."""

from pathlib import Path

import pytest
import yaml

from slotune import cli
from slotune.engine import engine_for
from slotune.engine.base import Violation
from slotune.engine.sglang import rules
from slotune.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
SGLANG = engine_for("sglang")
IMAGE = "lmsysorg/sglang:v0.5.5"


def messages(problems: list[Violation]) -> str:
    return " | ".join(str(p) for p in problems)


def problems_of(extra_args: list[str], gpus: int = 1, **engine: object) -> list[str]:
    raw = {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
        "engine": {"kind": "sglang", "image": IMAGE, "extraArgs": extra_args, **engine},
        "resources": {"gpus": gpus},
    }
    return parse_spec(raw)[1]


def test_each_table_is_the_dump_of_the_sglang_version_it_is_named_after() -> None:
    assert SGLANG.flag_table_versions == ("0.5.5", "0.5.23")  # release order, not text order
    folder = ROOT / "operator" / "slotune" / "engine" / "sglang" / "flags"
    for version in SGLANG.flag_table_versions:
        header = (folder / f"{version}.txt").read_text().splitlines()[0]
        assert f"in SGLang {version}, dumped from its parser" in header
    assert {"--chunked-prefill-size", "--dp-size", "--enable-metrics"} <= rules.TABLES.known_flags()
    assert rules.TABLES.flag_arity()["--bucket-time-to-first-token"] == "+"


def test_every_sglang_knobs_flag_is_in_every_table() -> None:
    """The typed settings render the same flags for every SGLang release slotune has a table of,
    and the flags slotune renders itself are real."""
    for version in SGLANG.flag_table_versions:
        known = rules.TABLES.known_flags(version)
        for knob in rules.KNOBS:
            assert knob.flag in known, (version, knob.field)
        assert {"--model-path", "--served-model-name", "--tp-size", "--enable-metrics"} <= known


@pytest.mark.parametrize(
    "extra",
    [
        ["--schedule-policy", "lpm", "--enable-metrics-for-all-schedulers"],
        ["--enable-metrics"],  # a flag that is also the start of another is itself
        ["--log-level", "debug", "--random-seed", "-1"],
        ["--bucket-time-to-first-token", "0.5", "1", "2"],
        ["--kv-cache-dtype=fp8_e5m2", "--schedule-conservativeness", "0.3"],
    ],
)
def test_real_sglang_flags_pass(extra: list[str]) -> None:
    assert rules.check_extra_args(extra) == []
    assert problems_of(extra) == []


def test_an_unknown_sglang_flag_is_refused_with_the_nearest_real_one() -> None:
    found = messages(rules.check_extra_args(["--schedule-polcy", "lpm"]))
    assert (
        "spec.engine.extraArgs[0]: --schedule-polcy is not a flag of SGLang 0.5.5 (SGLang exits "
        "with 'unrecognized arguments'); did you mean --schedule-policy?" in found
    )
    # vLLM's spelling of a typed setting.
    assert "is not a flag of SGLang 0.5.5" in messages(
        rules.check_extra_args(["--max-num-seqs", "64"])
    )


def test_underscores_are_refused_for_sglang_with_the_dashed_flag() -> None:
    """SGLang's parser, unlike vLLM's, reads no underscores in flag names."""
    found = rules.check_extra_args(["--schedule_policy", "lpm"])
    assert messages(found) == (
        "spec.engine.extraArgs[0]: --schedule_policy: SGLang's parser takes dashes, not "
        "underscores, in flag names (SGLang exits with 'unrecognized arguments'); write "
        "--schedule-policy"
    )
    # The flag meant is checked as meant: a tuned one points at its field.
    assert messages(rules.check_extra_args(["--max_running_requests", "64"])) == (
        "spec.engine.extraArgs[0]: --max_running_requests (SGLang's --max-running-requests) is "
        "a tuned setting; set spec.engine.args.maxNumSeqs instead of passing it in extraArgs"
    )


def test_a_start_of_an_sglang_flag_is_read_as_its_parser_reads_it() -> None:
    found = messages(rules.check_extra_args(["--schedule-pol", "lpm"]))
    assert (
        "--schedule-pol is not a full SGLang flag name: SGLang reads it as --schedule-policy"
        in (found)
    )
    assert "--pp is the start of several SGLang flags (--pp-max-micro-batch-size, --pp-size" in (
        messages(rules.check_extra_args(["--pp", "2"]))
    )
    # `--tp 2` is SGLang's --tp-size, which slotune sets from the pod's GPUs.
    assert messages(rules.check_extra_args(["--tp", "2"])) == (
        "spec.engine.extraArgs[0]: --tp (SGLang's --tp-size) is managed by slotune: set "
        "spec.resources.gpus (slotune runs a pod's GPUs tensor-parallel)"
    )
    assert "--tensor-parallel-size is managed by slotune" in messages(
        rules.check_extra_args(["--tensor-parallel-size=2"])
    )


def test_a_start_one_sglang_reads_as_a_flag_is_ambiguous_to_a_later_one() -> None:
    """Why a start of a flag's name is refused though SGLang's parser takes it."""
    assert "--enable-dp-att is not a full SGLang flag name: SGLang reads it as " in messages(
        rules.check_extra_args(["--enable-dp-att"], "0.5.5")
    )
    assert messages(rules.check_extra_args(["--enable-dp-att"], "0.5.23")) == (
        "spec.engine.extraArgs[0]: --enable-dp-att is the start of several SGLang flags "
        "(--enable-dp-attention, --enable-dp-attention-local-control-broadcast; SGLang exits "
        "with 'ambiguous option'): write the full name"
    )


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--schedule-policy"], "--schedule-policy takes a value (SGLang exits with 'expected"),
        (["--random-seed", "--enable-metrics"], "--random-seed takes a value, but"),
        (["--enable-metrics", "true"], "is a switch and takes no value, but is given 'true'"),
        (["--enable-metrics=1"], "write --enable-metrics alone"),
        (["--random-seed", "1", "2"], "'2' is a value with no flag before it"),
    ],
)
def test_values_are_counted_as_sglangs_parser_counts_them(extra: list[str], fragment: str) -> None:
    problems = rules.check_extra_args(extra)
    assert fragment in messages(problems)
    assert len(problems) == 1, problems  # one mistake, one problem


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--random-seed", "abc"], "--random-seed takes an integer, not 'abc'"),
        (["--schedule-conservativeness=x"], "--schedule-conservativeness takes a number"),
        (["--schedule-policy", "lmp"], "'lmp' is not a value --schedule-policy takes; did you "),
        (["--kv-cache-dtype", "int4"], "'int4' is not a value --kv-cache-dtype takes"),
    ],
)
def test_a_value_sglangs_parser_would_refuse_is_named(extra: list[str], expected: str) -> None:
    assert expected in messages(rules.check_extra_args(extra))


def test_a_typographic_dash_is_named_for_sglang_and_the_flag_meant_is_checked() -> None:
    found = messages(rules.check_extra_args(["\u2014schedule-policy", "lpm", "\u2013tp", "2"]))
    assert "'\u2014schedule-policy' starts with a typographic dash (EM DASH), which SGLang" in (
        found
    )
    assert "write '--schedule-policy'" in found
    assert "--tp (SGLang's --tp-size) is managed by slotune" in found
    assert "is a value with no flag before it" not in found


def test_sglang_parallelism_beyond_the_pods_gpus_is_refused() -> None:
    """SGLang runs tp x pp x dp GPUs, and slotune sets tp to the pod's GPUs."""
    assert problems_of(["--dp", "2"], gpus=2) == [
        "spec.engine.extraArgs[0]: --dp is not a full SGLang flag name: SGLang reads it as "
        "--dp-size (a start that a later release's new flag can make ambiguous); write --dp-size",
        "spec.engine.extraArgs[0]: --tp-size 2 (spec.resources.gpus) x --dp-size 2 needs 4 "
        "GPUs, but the pod has resources.gpus=2, all of them tensor-parallel; data parallelism "
        "is not supported: remove it (raise resources.gpus for more tensor parallelism, or "
        "spec.replicas for more copies)",
    ]
    assert "--pipeline-parallel-size 2 needs 2 GPUs" in messages(
        rules.check_resources(["--pipeline-parallel-size=2"], 1, "0.5.5")
    )
    # Under data-parallel attention the groups split the tensor-parallel GPUs.
    assert problems_of(["--dp-size", "2", "--enable-dp-attention"], gpus=2) == []
    assert "it must divide them (SGLang asserts tp_size % dp_size == 0)" in messages(
        rules.check_resources(["--dp-size", "3", "--enable-dp-attention"], 2, "0.5.5")
    )
    # A tensor-parallel size given anyway (refused on its own) is the one SGLang runs with.
    assert rules.check_resources(["--tp-size", "1", "--dp-size", "2"], 2, "0.5.5") == []
    assert rules.check_resources(["--dp-size", "1"], 1, "0.5.5") == []


def test_an_sglang_api_key_in_env_is_refused_with_where_it_belongs() -> None:
    assert problems_of([], env=[{"name": "SGLANG_API_KEY", "value": "s3cret"}]) == [
        "spec.engine.env[0].name: SGLANG_API_KEY is not set here: put the key in a Secret and "
        "name it in engine.apiKeySecretRef"
    ]
    assert problems_of(["--api-key", "s3cret"]) == [
        "spec.engine.extraArgs[0]: --api-key is managed by slotune: put the key in a Secret and "
        "name it in spec.engine.apiKeySecretRef"
    ]


@pytest.mark.parametrize(
    ("image", "table"),
    [
        ("lmsysorg/sglang:v0.5.5", "0.5.5"),
        ("lmsysorg/sglang:v0.5.5-cu129", "0.5.5"),
        ("lmsysorg/sglang:v0.5.9", "0.5.5"),  # the newest older table
        ("lmsysorg/sglang:v0.5.30", "0.5.23"),
        ("lmsysorg/sglang:v0.4.10", "0.5.5"),  # older than every table: the oldest
        ("lmsysorg/sglang:latest", rules.PINNED_VERSION),
    ],
)
def test_an_sglang_image_is_checked_against_its_own_table_or_the_nearest_older_one(
    image: str, table: str
) -> None:
    assert rules.TABLES.version_of_image(image) == table
    note = SGLANG.image_note(image)
    if rules.TABLES.exact_table(image):
        assert note == ""
    else:
        assert f"the flags were checked against SGLang {table}'s parser" in note


def test_an_unknown_sglang_version_warns_which_table_was_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((ROOT / "samples" / "qwen-sglang.yaml").read_text())
    doc["spec"]["engine"]["image"] = "lmsysorg/sglang:v0.5.9"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", str(path)]) == 0
    assert (
        "qwen-sglang: warning: the flags were checked against SGLang 0.5.5's parser: slotune "
        "has no flag table for SGLang 0.5.9 (it has 0.5.5, 0.5.23)" in capsys.readouterr().err
    )


def test_a_flag_a_later_sglang_added_is_refused_for_the_earlier_and_names_it() -> None:
    assert rules.check_extra_args(["--attn-dp-size", "2"], "0.5.23") == []
    assert messages(rules.check_extra_args(["--attn-dp-size", "2"], "0.5.5")) == (
        "spec.engine.extraArgs[0]: --attn-dp-size is not a flag of SGLang 0.5.5 (SGLang exits "
        "with 'unrecognized arguments'): it came in SGLang 0.5.23; remove it, or run an image "
        "of 0.5.23 or later"
    )


def test_a_flag_a_later_sglang_removed_is_refused_with_how_that_release_reads_it() -> None:
    """0.5.23 has no --cuda-graph-max-bs; its name is now the start of two flags."""
    assert rules.check_extra_args(["--cuda-graph-max-bs", "256"], "0.5.5") == []
    assert messages(rules.check_extra_args(["--cuda-graph-max-bs", "256"], "0.5.23")) == (
        "spec.engine.extraArgs[0]: --cuda-graph-max-bs was removed between SGLang 0.5.5 and "
        "0.5.23: remove it (SGLang 0.5.23 exits with 'ambiguous option': it is the start of "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill)"
    )
    assert "--stream-output was removed between SGLang 0.5.5 and 0.5.23: remove it (SGLang " in (
        messages(rules.check_extra_args(["--stream-output"], "0.5.23"))
    )


def test_validate_engine_version_reports_what_an_sglang_upgrade_breaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((ROOT / "samples" / "qwen-sglang.yaml").read_text())
    doc["spec"]["engine"]["extraArgs"] = ["--cuda-graph-max-bs", "256"]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", "--engine-version", "0.5.5", str(path)]) == 0
    assert cli.main(["validate", "--engine-version", "0.5.23", str(path)]) == 1
    assert (
        "qwen-sglang: with SGLang 0.5.23: spec.engine.extraArgs[0]: --cuda-graph-max-bs was "
        "removed between SGLang 0.5.5 and 0.5.23" in capsys.readouterr().err
    )
