"""An engine's flag tables, one per release: the flags each release's parser accepts, which
table an image is checked against, and what moving between two releases takes away.

Engines rename and remove flags between releases (vLLM's `--max-num-partial-prefills` went
after 0.24), so a spec is checked against the table of the version its image names. Each
adapter package keeps its tables in `flags/<version>.txt`, dumped from the real parser by
`scripts/dump-vllm-flags.py` or `scripts/dump-sglang-flags.py`, one line an option:
`OPTION ARITY TYPE CHOICES`. What a release removed is read from the difference between its
table and an older one, not written by hand.

Pure: plain data read from the package's own files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@cache
def _versions(package: str) -> tuple[str, ...]:
    folder = resources.files(package).joinpath("flags")
    found = [p.name.removesuffix(".txt") for p in folder.iterdir() if p.name.endswith(".txt")]
    return tuple(sorted(found, key=_release))


@cache
def _rows(package: str, version: str) -> Mapping[str, tuple[str, ...]]:
    table = resources.files(package).joinpath("flags", f"{version}.txt")
    rows = {}
    for line in table.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            option, *rest = line.split()
            rows[option] = tuple(rest)
    return rows


@cache
def _known(package: str, version: str) -> frozenset[str]:
    return frozenset(_rows(package, version))


@cache
def _arity(package: str, version: str) -> Mapping[str, str]:
    return {option: rest[0] for option, rest in _rows(package, version).items()}


@cache
def _values(package: str, version: str) -> Mapping[str, tuple[str, tuple[str, ...]]]:
    found = {}
    for option, rest in _rows(package, version).items():
        kind, choices = [*rest[1:], "-", "-"][:2]
        if kind != "-" or choices != "-":
            found[option] = (kind, tuple(choices.split(",")) if choices != "-" else ())
    return found


@dataclass(frozen=True)
class Removal:
    """A flag, or one value of a flag, that an older table has and `removed_in`'s lacks."""

    what: str  # `--foo`, or `--foo all`
    last_had: str  # the newest table that has it
    removed_in: str  # the table after that one, the first without it
    engine: str  # the engine's name in messages

    def when(self) -> str:
        """`in vLLM 0.32.0` where the two tables are consecutive releases (the next patch, or
        the next minor's first); else the span: SGLang's 0.5.5 and 0.5.23 have 17 releases
        between them."""
        old, new = _release(self.last_had), _release(self.removed_in)
        next_minor = old[0] == new[0] and new[1] == old[1] + 1 and new[2:] in ((), (0,))
        next_patch = len(old) == len(new) == 3 and old[:2] == new[:2] and new[2] == old[2] + 1
        consecutive = next_minor or next_patch
        if consecutive:
            return f"in {self.engine} {self.removed_in} ({self.last_had} has it)"
        return f"between {self.engine} {self.last_had} and {self.removed_in}"


@dataclass(frozen=True)
class FlagTables:
    """The flag tables in one adapter package's `flags/` folder."""

    package: str  # the adapter package that holds `flags/` (`slotune.engine.vllm`)
    engine: str  # its name in messages (`vLLM`)
    pinned: str  # the version of the default image's table, for a tag that names no version

    def supported_versions(self) -> tuple[str, ...]:
        """The versions slotune has a flag table of, oldest first."""
        return _versions(self.package)

    def flag_arity(self, version: str | None = None) -> Mapping[str, str]:
        """Every option string the parser accepts, with the number of values it takes as
        argparse counts them ("0", "1", "?", "*", "+"), dumped from the real parser."""
        return _arity(self.package, version or self.pinned)

    def flag_values(self, version: str | None = None) -> Mapping[str, tuple[str, tuple[str, ...]]]:
        """For each option whose parser converts or lists its values: the type (`int`,
        `float`, or `-`) and the values it accepts (empty: any), dumped from the real parser."""
        return _values(self.package, version or self.pinned)

    def known_flags(self, version: str | None = None) -> frozenset[str]:
        """Every option string the parser accepts."""
        return _known(self.package, version or self.pinned)

    def table_for(self, version: str | None) -> str:
        """The table a version is checked against: its own; for a version without one, the
        newest older table (a release keeps most of its predecessor's flags, and removes them
        after a deprecation), or the oldest table for a version older than all; the pinned
        table for an image whose tag names no version."""
        if version is None:
            return self.pinned
        tables = self.supported_versions()
        older = [t for t in tables if _release(t) <= _release(version)]
        return older[-1] if older else tables[0]

    def exact_table(self, image: str) -> bool:
        """Whether slotune has the flag table of the image's own engine version."""
        return image_version(image) in self.supported_versions()

    def version_of_image(self, image: str) -> str:
        """The version whose flag table applies to an image (`…:v0.32.0` → 0.32.0)."""
        return self.table_for(image_version(image))

    def flag_table_note(self, image: str) -> str:
        """What an image's flags were checked against, when it is not the image's own version:
        an image whose tag names no version with a table (a newer release, `:latest`) is
        checked against another table, which may lack its new flags or still list removed
        ones."""
        if self.exact_table(image):
            return ""
        named = image_version(image)
        version = named if named else f"of {image!r}"
        return (
            f"the flags were checked against {self.engine} {self.table_for(named)}'s parser: "
            f"slotune has no flag table for {self.engine} {version} (it has "
            f"{', '.join(self.supported_versions())}); pin an image tag with one of those "
            "versions for an exact check"
        )

    def _older(self, version: str) -> list[str]:
        """The tables older than `version`, newest first."""
        return [t for t in reversed(self.supported_versions()) if _release(t) < _release(version)]

    def _removal(self, what: str, had: str | None) -> Removal | None:
        """The newest older table that has something, and the table after it, which has not."""
        if had is None:
            return None
        tables = self.supported_versions()
        return Removal(what, had, tables[tables.index(had) + 1], self.engine)

    def removed_flag(self, option: str, version: str) -> Removal | None:
        """When an option `version`'s table lacks was removed, if an older table has it."""
        if option in self.known_flags(version):
            return None
        had = next((t for t in self._older(version) if option in self.known_flags(t)), None)
        return self._removal(option, had)

    def removed_value(self, option: str, value: str, version: str) -> Removal | None:
        """When a value `version`'s table no longer lists for an option was removed, if an
        older table lists it."""

        def listed(table: str) -> tuple[str, ...]:
            return self.flag_values(table).get(option, ("-", ()))[1]

        if not listed(version) or value in listed(version):
            return None
        had = next((t for t in self._older(version) if value in listed(t)), None)
        return self._removal(f"{option} {value}", had)

    def added_in(self, option: str, version: str) -> str | None:
        """The first table newer than `version` that has an option `version`'s table lacks."""
        newer = [t for t in self.supported_versions() if _release(t) > _release(version)]
        return next((t for t in newer if option in self.known_flags(t)), None)


def image_version(image: str) -> str | None:
    """The engine version an image's tag names (`…:v0.32.0-cu130` → 0.32.0), table or not."""
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    match = re.match(r"^v?(\d+\.\d+\.\d+)", tag)
    return match.group(1) if match else None
