"""SGLang's flags: the typed settings' flags, the flags the operator owns, and the rules
`spec.engine.extraArgs` must pass, checked against the flag table of the image's SGLang
(`flags/<version>.txt`, dumped from `ServerArgs.add_cli_args` by
`scripts/dump-sglang-flags.py`).

SGLang parses its command line with a plain `argparse.ArgumentParser`
(`srt/server_args.py`, `prepare_server_args`), so its names are read as argparse reads them,
not as vLLM's parser does: an underscore is not a dash (`--max_running_requests` exits with
'unrecognized arguments'), and a unique start of a flag's name is that flag (`--tp 8` is
`--tp-size 8`, as SGLang's own usage lines write it), while a start shared by several exits with
'ambiguous option' (`--pp` in 0.5.5: `--pp-size` or `--pp-max-micro-batch-size`). A start is
refused all the same, with the flag it stands for: a later release's new flag can make it
ambiguous (`--context`, `--context-length` in 0.5.5, is also `--context-bucket`'s start
in 0.5.23).

Pure: plain data and functions of plain data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from slotune.engine import extra_args as checks
from slotune.engine.base import Violation
from slotune.engine.flag_tables import FlagTables
from slotune.engine.knobs import Choices, FloatSpan, IntSpan, Knob

# The version of the default SGLang image's table (samples/qwen-sglang.yaml), used for an image
# whose tag names no version.
PINNED_VERSION = "0.5.5"

TABLES = FlagTables(package="slotune.engine.sglang", engine="SGLang", pinned=PINNED_VERSION)

KNOBS: tuple[Knob, ...] = (
    Knob(
        "max_num_batched_tokens",
        "--chunked-prefill-size",
        "maxNumBatchedTokens",
        short="batched",
        search={"h200": IntSpan(256, 32768, log=True)},
    ),
    Knob(
        "block_size",
        "--page-size",
        "blockSize",
        short="block",
        search={"h200": Choices((1, 16, 32, 64))},
        defaults={"h200": 1},
    ),
    Knob(
        "gpu_memory_utilization",
        "--mem-fraction-static",
        "gpuMemoryUtilization",
        short="gmu",
        search={"h200": FloatSpan(0.70, 0.92, step=0.01)},
    ),
    Knob(
        "max_num_seqs",
        "--max-running-requests",
        "maxNumSeqs",
        short="seqs",
        search={"h200": IntSpan(8, 1024, log=True)},
    ),
    Knob("max_model_len", "--context-length", "maxModelLen", short="len"),
    Knob(
        "enable_prefix_caching",
        "--disable-radix-cache",
        "enablePrefixCaching",
        short="prefix",
        inverted=True,
        search={"h200": Choices((True, False))},
        defaults={"h200": True},
    ),
)

# Flags the operator owns, each with what to set instead; the parser's aliases of each too.
_GPUS = "set spec.resources.gpus (slotune runs a pod's GPUs tensor-parallel)"
MANAGED_FLAGS: Mapping[str, str] = {
    "--model-path": "set spec.model.name",
    "--model": "set spec.model.name",
    "--served-model-name": "set spec.model.servedName",
    "--host": "the operator binds the engine to all addresses",
    "--port": "the operator serves on SGLang's port 30000, named http",
    "--tensor-parallel-size": _GPUS,
    "--tp-size": _GPUS,
    "--api-key": "put the key in a Secret and name it in spec.engine.apiKeySecretRef",
}

# The parallel sizes whose product is the GPUs SGLang runs on, by each spelling of its flag.
PARALLEL_FLAGS: Mapping[str, str] = {
    "--tensor-parallel-size": "tensor",
    "--tp-size": "tensor",
    "--pipeline-parallel-size": "pipeline",
    "--pp-size": "pipeline",
    "--data-parallel-size": "data",
    "--dp-size": "data",
}
DP_ATTENTION = "--enable-dp-attention"


@dataclass(frozen=True)
class Reading:
    """How SGLang's parser reads a flag's name (the part before any `=`)."""

    name: str  # as written
    option: str | None  # the flag it is, as the table names it; None: none (or several)
    how: Literal["exact", "prefix", "underscores", "ambiguous", "unknown"]
    candidates: tuple[str, ...] = ()  # for an ambiguous start, the flags it could be

    def shown(self) -> str:
        """The name as written, with the flag it is where that differs."""
        if self.option is None or self.option == self.name:
            return self.name
        return f"{self.name} (SGLang's {self.option})"


def read_name(name: str, known: frozenset[str]) -> Reading:
    """The flag SGLang's parser takes a name for: itself; else the one flag it is the start
    of (argparse's abbreviations, for `--` names); for a name with underscores, which the
    parser does not read, the flag meant, read the same way with dashes."""
    if name in known:
        return Reading(name, name, "exact")
    if name.startswith("--"):
        starts = tuple(sorted(flag for flag in known if flag.startswith(name)))
        if len(starts) == 1:
            return Reading(name, starts[0], "prefix")
        if starts:
            return Reading(name, None, "ambiguous", starts)
    if "_" in name:
        meant = read_name(name.replace("_", "-"), known)
        if meant.option is not None:
            return Reading(name, meant.option, "underscores")
    return Reading(name, None, "unknown")


def _parsed(name: str, known: frozenset[str]) -> str:
    """The flag the parser takes a name for, where it takes it for one (no underscores, no
    ambiguity); else the name."""
    reading = read_name(name, known)
    return reading.option if reading.how in ("exact", "prefix") and reading.option else name


def check_extra_args(
    extra_args: Sequence[str], version: str = PINNED_VERSION, *, exact: bool = True
) -> list[Violation]:
    """Problems with `spec.engine.extraArgs`, each naming the fix (`exact`: the table is the
    image's own version's, so a value's choices are checked too)."""
    known = TABLES.known_flags(version)
    arity = TABLES.flag_arity(version)
    tuned = {spelling: knob for knob in KNOBS for spelling in knob.spellings()}
    # A flag pasted with a typographic dash is reported, and checked below as meant.
    meant, problems = checks.with_ascii_dashes(extra_args, "SGLang")

    def read(name: str) -> tuple[str, str]:
        option = read_name(name, known).option or name
        return option, arity.get(option, "*")

    def refused(option: str, value: str) -> str | None:
        return checks.value_problem(TABLES, option, value, version, choices_too=exact)

    problems += checks.check_values(meant, read, refused, switches=known, engine="SGLang")
    for index, token in enumerate(meant):
        if not checks.is_value(token):
            reading = read_name(token.partition("=")[0], known)
            problem = _name_problem(reading, tuned, version)
            if problem:
                problems.append(Violation(f"spec.engine.extraArgs[{index}]", problem))
    return problems


def _name_problem(reading: Reading, tuned: Mapping[str, Knob], version: str) -> str:
    """What is wrong with a flag's name as SGLang's parser reads it; empty when nothing is."""
    name, option = reading.name, reading.option
    if (removal := TABLES.removed_flag(name, version)) is not None:
        # A removed flag's name can now be the start of others: read as one, or ambiguous.
        now = {
            "prefix": f"SGLang {version} would read it as {option}",
            "ambiguous": f"SGLang {version} exits with 'ambiguous option': it is the start of "
            + ", ".join(reading.candidates[:4]),
        }.get(reading.how, "SGLang exits with 'unrecognized arguments'")
        return f"{name} was removed {removal.when()}: remove it ({now})"
    if (knob := tuned.get(option or "")) is not None:
        return (
            f"{reading.shown()} is a tuned setting; set spec.engine.args.{knob.spec_name} "
            "instead of passing it in extraArgs"
        )
    if (owned := MANAGED_FLAGS.get(option or "")) is not None:
        return f"{reading.shown()} is managed by slotune: {owned}"
    if reading.how == "exact":
        return ""
    if reading.how == "prefix":
        return (
            f"{name} is not a full SGLang flag name: SGLang reads it as {option} (a start that "
            f"a later release's new flag can make ambiguous); write {option}"
        )
    if reading.how == "underscores":
        return (
            f"{name}: SGLang's parser takes dashes, not underscores, in flag names (SGLang exits "
            f"with 'unrecognized arguments'); write {option}"
        )
    if reading.how == "ambiguous":
        more = ", ..." if len(reading.candidates) > 4 else ""
        return (
            f"{name} is the start of several SGLang flags ({', '.join(reading.candidates[:4])}"
            f"{more}; SGLang exits with 'ambiguous option'): write the full name"
        )
    exits = "SGLang exits with 'unrecognized arguments'"
    if (added := TABLES.added_in(name, version)) is not None:
        return (
            f"{name} is not a flag of SGLang {version} ({exits}): it came in SGLang {added}; "
            f"remove it, or run an image of {added} or later"
        )
    near = checks.nearest_flag(name, TABLES.known_flags(version))
    hint = f"did you mean {near}?" if near else "check the name against its --help"
    return f"{name} is not a flag of SGLang {version} ({exits}); {hint}"


def check_resources(extra_args: Sequence[str], gpus: int, version: str) -> list[Violation]:
    """The GPUs SGLang's parallel sizes ask for against the pod's: SGLang runs tensor x
    pipeline x data parallel GPUs, and slotune sets the tensor-parallel size to the pod's
    GPUs, so a data- or pipeline-parallel size above 1 has no GPUs to run on. Under
    `--enable-dp-attention` the data-parallel groups split the tensor-parallel GPUs instead
    (in 0.5.5, and as `--attn-dp-size` later), and must divide them."""
    known = TABLES.known_flags(version)

    def parsed(name: str) -> str:
        return _parsed(name, known)

    sizes = {"tensor": max(gpus, 1), "pipeline": 1, "data": 1}
    spelled = {"tensor": f"--tp-size {sizes['tensor']} (spec.resources.gpus)"}
    asked: list[tuple[int, str]] = []  # (index, kind) of each pipeline or data size above 1
    # The last of a flag's uses wins, as in argparse; extraArgs follow slotune's own.
    for index, option, value in checks.flag_uses(extra_args, parsed, PARALLEL_FLAGS):
        if value.isdigit() and int(value) > 0:  # a size of 0 asks for no GPUs
            kind = PARALLEL_FLAGS[option]
            sizes[kind], spelled[kind] = int(value), f"{option} {value}"
            if kind != "tensor" and int(value) > 1:
                asked.append((index, kind))
    dp_attention = DP_ATTENTION in {parsed(token.partition("=")[0]) for token in extra_args}
    if dp_attention and sizes["tensor"] % sizes["data"]:
        index = next(i for i, kind in reversed(asked) if kind == "data")
        return [
            Violation(
                f"spec.engine.extraArgs[{index}]",
                f"{spelled['data']} with {DP_ATTENTION} splits the tensor-parallel GPUs "
                f"({spelled['tensor']}) into data-parallel attention groups, so it must divide "
                "them (SGLang asserts tp_size % dp_size == 0)",
            )
        ]
    kinds = ("tensor", "pipeline") if dp_attention else ("tensor", "pipeline", "data")
    needed = sizes["tensor"] * sizes["pipeline"] * (1 if dp_attention else sizes["data"])
    if needed <= max(gpus, 1):
        return []
    product = " x ".join(spelled[kind] for kind in kinds if kind in spelled)
    return [
        Violation(
            f"spec.engine.extraArgs[{index}]",
            f"{product} needs {needed} GPUs, but the pod has resources.gpus={gpus}, all of them "
            f"tensor-parallel; {kind} parallelism is not supported: remove it (raise "
            "resources.gpus for more tensor parallelism, or spec.replicas for more copies)",
        )
        for index, kind in asked
        if kind in kinds
    ]
