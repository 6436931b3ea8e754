"""vLLM's flag tables, one per release: the flags each release's `vllm serve` accepts, which
table an image is checked against, and what moving between two releases takes away.

vLLM renames and removes flags between releases (`--max-num-partial-prefills` went after
0.24), so a spec is checked against the table of the version its image names. The tables are
dumped from the real parsers by `scripts/dump-vllm-flags.py` into `flags/<version>.txt`;
what a release removed is read from the difference between its table and an older one, not
written by hand. Only what to use instead is curated (`REPLACEMENTS`), from vLLM's source.

Pure: plain data read from the package's own files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

# The version of the default image's table, used for an image whose tag names no version.
PINNED_VERSION = "0.32.0"

_KV_SCALES = "remove it; vLLM loads the k and v scales from the checkpoint, else uses 1.0"

# What to use instead of a flag a newer table lacks, where vLLM's source says; a flag the
# tables show removed without an entry here is reported without one.
_PREFILL_CAP = "use spec.engine.args.longPrefillTokenThreshold (--long-prefill-token-threshold)"

REPLACEMENTS: dict[str, str] = {
    # 0.24.0's V1 scheduler reads only long_prefill_token_threshold; the two partial-prefill
    # limits were checked in SchedulerConfig and enforced nowhere.
    "--max-num-partial-prefills": _PREFILL_CAP,
    "--max-long-partial-prefills": _PREFILL_CAP,
    # 0.24.0 (config/cache.py): deprecated; "the scales will be loaded from the model
    # checkpoint if available, otherwise they default to 1.0". 0.31.0 has no such option.
    "--calculate-kv-scales": _KV_SCALES,
    "--no-calculate-kv-scales": _KV_SCALES,
}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@cache
def supported_versions() -> tuple[str, ...]:
    """The versions slotune has a flag table of, oldest first."""
    folder = resources.files("slotune.engine.vllm").joinpath("flags")
    found = [p.name.removesuffix(".txt") for p in folder.iterdir() if p.name.endswith(".txt")]
    return tuple(sorted(found, key=_release))


@cache
def _rows(version: str) -> Mapping[str, tuple[str, ...]]:
    """Each option of a table with the rest of its line (arity, type, choices)."""
    table = resources.files("slotune.engine.vllm").joinpath("flags", f"{version}.txt")
    rows = {}
    for line in table.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            option, *rest = line.split()
            rows[option] = tuple(rest)
    return rows


@cache
def flag_arity(version: str = PINNED_VERSION) -> Mapping[str, str]:
    """Every option string vLLM's `serve` parser accepts, with the number of values it takes
    as argparse counts them ("0", "1", "?", "*", "+"), dumped from the real parser."""
    return {option: rest[0] for option, rest in _rows(version).items()}


@cache
def flag_values(version: str = PINNED_VERSION) -> Mapping[str, tuple[str, tuple[str, ...]]]:
    """For each option whose parser converts or lists its values: the type (`int`, `float`,
    or `-`) and the values it accepts (empty: any), dumped from the real parser."""
    found = {}
    for option, rest in _rows(version).items():
        kind, choices = [*rest[1:], "-", "-"][:2]
        if kind != "-" or choices != "-":
            found[option] = (kind, tuple(choices.split(",")) if choices != "-" else ())
    return found


@cache
def known_flags(version: str = PINNED_VERSION) -> frozenset[str]:
    """Every option string vLLM's `serve` parser accepts."""
    return frozenset(_rows(version))


def image_version(image: str) -> str | None:
    """The vLLM version an image's tag names (`…:v0.32.0-cu130` → 0.32.0), table or not."""
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    match = re.match(r"^v?(\d+\.\d+\.\d+)", tag)
    return match.group(1) if match else None


def table_for(version: str | None) -> str:
    """The table a version is checked against: its own; for a version without one, the newest
    older table (a release keeps most of its predecessor's flags, and removes them after a
    deprecation), or the oldest table for a version older than all; the pinned table for an
    image whose tag names no version."""
    if version is None:
        return PINNED_VERSION
    tables = supported_versions()
    older = [t for t in tables if _release(t) <= _release(version)]
    return older[-1] if older else tables[0]


def exact_table(image: str) -> bool:
    """Whether slotune has the flag table of the image's own vLLM version."""
    return image_version(image) in supported_versions()


def version_of_image(image: str) -> str:
    """The vLLM version whose flag table applies to an image (`…:v0.32.0` → 0.32.0)."""
    return table_for(image_version(image))


def flag_table_note(image: str) -> str:
    """What an image's flags were checked against, when it is not the image's own version:
    an image whose tag names no version with a table (a newer release, `:latest`) is checked
    against another table, which may lack its new flags or still list removed ones."""
    if exact_table(image):
        return ""
    named = image_version(image)
    version = named if named else f"of {image!r}"
    return (
        f"the flags were checked against vLLM {table_for(named)}'s parser: slotune has no flag "
        f"table for vLLM {version} (it has {', '.join(supported_versions())}); pin an image "
        "tag with one of those versions for an exact check"
    )


@dataclass(frozen=True)
class Removal:
    """A flag, or one value of a flag, that an older table has and `removed_in`'s lacks."""

    what: str  # `--foo`, or `--foo all`
    last_had: str  # the newest table that has it
    removed_in: str  # the table after that one, the first without it

    def when(self) -> str:
        """`in vLLM 0.32.0` where the two tables are consecutive releases; else the span."""
        old, new = _release(self.last_had), _release(self.removed_in)
        consecutive = old[0] == new[0] and (
            old[1] == new[1] or (new[1] == old[1] + 1 and new[2:] in ((), (0,)))
        )
        if consecutive:
            return f"in vLLM {self.removed_in} ({self.last_had} has it)"
        return f"between vLLM {self.last_had} and {self.removed_in}"


def _older(version: str) -> list[str]:
    """The tables older than `version`, newest first."""
    return [t for t in reversed(supported_versions()) if _release(t) < _release(version)]


def _removal(what: str, had: str | None) -> Removal | None:
    """The newest older table that has something, and the table after it, which has not."""
    if had is None:
        return None
    tables = supported_versions()
    return Removal(what, had, tables[tables.index(had) + 1])


def removed_flag(option: str, version: str) -> Removal | None:
    """When an option `version`'s table lacks was removed, if an older table has it."""
    if option in known_flags(version):
        return None
    return _removal(option, next((t for t in _older(version) if option in known_flags(t)), None))


def removed_value(option: str, value: str, version: str) -> Removal | None:
    """When a value `version`'s table no longer lists for an option was removed, if an older
    table lists it."""

    def listed(table: str) -> tuple[str, ...]:
        return flag_values(table).get(option, ("-", ()))[1]

    if not listed(version) or value in listed(version):
        return None
    had = next((t for t in _older(version) if value in listed(t)), None)
    return _removal(f"{option} {value}", had)


def added_in(option: str, version: str) -> str | None:
    """The first table newer than `version` that has an option `version`'s table lacks."""
    newer = [t for t in supported_versions() if _release(t) > _release(version)]
    return next((t for t in newer if option in known_flags(t)), None)
