"""vLLM's flag tables per release, from the tables dumped from the real parsers (no fakes): a
spec is checked against its image's version, and `slotune validate --engine-version` says what
moving it to another version breaks.

The differences used here are the real ones: 0.32.0 added `--grpc-port` and dropped the value
`all` of `--mamba-cache-mode` (deprecated in 0.31.0's source); `--max-num-partial-prefills`
is in the CUDA 0.24.0 table and in neither CPU table.
"""

import re
from pathlib import Path

import pytest
import yaml

from slotune import cli
from slotune.engine import ENGINES
from slotune.engine.sglang import Sglang
from slotune.engine.vllm import ENGINE, tables
from slotune.engine.vllm import rules as vllm
from slotune.models import SloSpec

ROOT = Path(__file__).resolve().parents[2]


def messages(problems: list[vllm.Violation]) -> str:
    return " | ".join(str(p) for p in problems)


def test_each_table_is_the_dump_of_the_version_it_is_named_after() -> None:
    assert {"0.24.0", "0.31.0", "0.32.0"} <= set(tables.supported_versions())
    folder = ROOT / "operator" / "slotune" / "engine" / "vllm" / "flags"
    for version in tables.supported_versions():
        header = (folder / f"{version}.txt").read_text().splitlines()[0]
        assert f"in vLLM {version}, dumped from its parser" in header
    # Release order, not text order (0.9 before 0.24).
    assert tables.supported_versions() == tuple(
        sorted(tables.supported_versions(), key=lambda v: [int(p) for p in v.split(".")])
    )


def test_a_flag_a_release_added_is_refused_for_the_release_before_and_names_it() -> None:
    assert vllm.check_extra_args(["--grpc-port", "50051"], "0.32.0") == []
    refused = messages(vllm.check_extra_args(["--grpc-port", "50051"], "0.31.0"))
    assert "--grpc-port is not a flag of vLLM 0.31.0" in refused
    assert "it came in vLLM 0.32.0" in refused


def test_a_value_a_release_removed_is_refused_for_it_with_the_values_left() -> None:
    assert vllm.check_extra_args(["--mamba-cache-mode", "all"], "0.31.0") == []
    refused = messages(vllm.check_extra_args(["--mamba-cache-mode", "all"], "0.32.0"))
    assert (
        "'all' was removed from --mamba-cache-mode in vLLM 0.32.0 (0.31.0 has it): use one of "
        "align, none" in refused
    )


def test_a_flag_the_older_table_has_and_the_newer_lacks_is_removed_with_its_replacement() -> None:
    assert vllm.check_extra_args(["--max-num-partial-prefills", "2"], "0.24.0") == []
    for version in ("0.31.0", "0.32.0"):
        refused = messages(vllm.check_extra_args(["--max-num-partial-prefills", "2"], version))
        # 0.24.0 and 0.31.0 are not consecutive releases: the removal is placed between them.
        assert (
            "--max-num-partial-prefills was removed between vLLM 0.24.0 and 0.31.0: use "
            "spec.engine.args.longPrefillTokenThreshold (--long-prefill-token-threshold)" in refused
        )
    refused = messages(vllm.check_extra_args(["--override-attention-dtype", "half"], "0.32.0"))
    assert "--override-attention-dtype was removed between vLLM 0.24.0 and 0.31.0: remove it" in (
        refused
    )


def test_every_replacement_is_for_a_removed_flag_and_names_flags_the_newest_table_has() -> None:
    newest = tables.supported_versions()[-1]
    for option, fix in tables.REPLACEMENTS.items():
        assert option not in tables.known_flags(newest), option
        assert any(option in tables.known_flags(v) for v in tables.supported_versions()), option
        for named in re.findall(r"--[a-z0-9-]+", fix):
            assert named in tables.known_flags(newest), (option, named)


def test_every_knobs_flag_is_in_every_table() -> None:
    """The typed settings render the same flags for every release slotune has a table of."""
    for version in tables.supported_versions():
        for knob in vllm.KNOBS:
            flags = {knob.flag} if knob.negative is None else {knob.flag, knob.negative}
            assert flags <= tables.known_flags(version), (version, knob.field)


@pytest.mark.parametrize(
    ("image", "table"),
    [
        ("vllm/vllm-openai:v0.24.0", "0.24.0"),
        ("vllm/vllm-openai:v0.28.0", "0.24.0"),  # the newest older table
        ("vllm/vllm-openai:v0.31.2", "0.31.0"),
        ("vllm/vllm-openai:v0.33.0", "0.32.0"),
        ("vllm/vllm-openai:v0.9.0", "0.24.0"),  # older than every table: the oldest
        ("vllm/vllm-openai:latest", tables.PINNED_VERSION),
    ],
)
def test_an_image_is_checked_against_its_own_table_or_the_nearest_older_one(
    image: str, table: str
) -> None:
    assert tables.version_of_image(image) == table
    note = tables.flag_table_note(image)
    if tables.exact_table(image):
        assert note == ""
    else:
        assert f"the flags were checked against vLLM {table}'s parser" in note


def test_the_histogram_flag_is_added_only_for_a_release_that_has_it() -> None:
    """0.31.0's parser has no `--custom-histogram-buckets`: its pods must not get it."""
    slo = SloSpec.model_validate({"ttft": {"percentile": 95, "maxSeconds": 2.0}})
    assert ENGINE.observability_args(slo, "example.com/vllm-cpu:v0.31.0", []) == []
    added = ENGINE.observability_args(slo, "example.com/vllm-cpu:v0.32.0", [])
    assert added[0] == "--custom-histogram-buckets"


def spec_file(tmp_path: Path, image: str, extra_args: list[str]) -> Path:
    doc = yaml.safe_load((ROOT / "samples" / "llama-8b.yaml").read_text())
    doc["spec"]["engine"]["image"] = image
    doc["spec"]["engine"]["extraArgs"] = extra_args
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_validate_engine_version_reports_what_an_upgrade_breaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path, "example.com/vllm-cpu:v0.31.0", ["--mamba-cache-mode", "all"])
    assert cli.main(["validate", str(path)]) == 0
    assert cli.main(["validate", "--engine-version", "0.31.0", str(path)]) == 0
    assert "valid for engine version 0.31.0" in capsys.readouterr().out
    assert cli.main(["validate", "--engine-version", "0.32.0", str(path)]) == 1
    err = capsys.readouterr().err
    assert (
        "llama-8b: with vLLM 0.32.0: spec.engine.extraArgs[0]: 'all' was removed from "
        "--mamba-cache-mode in vLLM 0.32.0 (0.31.0 has it)" in err
    )


def test_validate_engine_version_reports_what_a_downgrade_breaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path, "example.com/vllm-cpu:v0.32.0", ["--grpc-port", "50051"])
    assert cli.main(["validate", "--engine-version", "0.32.0", str(path)]) == 0
    assert cli.main(["validate", "--engine-version", "0.31.0", str(path)]) == 1
    err = capsys.readouterr().err
    assert "with vLLM 0.31.0: spec.engine.extraArgs[0]: --grpc-port is not a flag of" in err


def test_validate_engine_version_prints_a_problem_of_the_images_own_version_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path, "example.com/vllm-cpu:v0.31.0", ["--grpc-port", "50051"])
    assert cli.main(["validate", "--engine-version", "0.31.0", str(path)]) == 1
    assert capsys.readouterr().err.count("--grpc-port is not a flag of vLLM 0.31.0") == 1


def test_validate_refuses_an_engine_version_without_a_table_and_names_those_it_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path, "example.com/vllm-cpu:v0.32.0", [])
    assert cli.main(["validate", "--engine-version", "0.33.0", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"no flag table for vLLM 0.33.0 (it has {', '.join(tables.supported_versions())})" in err


def test_validate_engine_version_warns_for_an_engine_without_tables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Untabled(Sglang):
        flag_table_versions = ()

    monkeypatch.setitem(ENGINES, "sglang", Untabled())
    sglang = ROOT / "samples" / "qwen-sglang.yaml"
    assert cli.main(["validate", "--engine-version", "0.32.0", str(sglang)]) == 0
    assert "warning: --engine-version: slotune has no flag tables of SGLang" in (
        capsys.readouterr().err
    )
