"""`spec.engine.extraArgs` against an engine's flag table: the mistakes its argparse parser
would exit on at start-up (a flag pasted with a typographic dash, a switch given a value, a
flag missing its value, a value of the wrong type or not among its choices), found before a
pod is launched. Which flags an engine accepts, and how it reads their names (vLLM takes
underscores, SGLang does not), stays in the engine's adapter, which asks these checks with its
own reading.

Pure: argument lists and flag tables in, problems out.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Callable, Collection, Iterable, Sequence

from slotune.engine.base import Violation
from slotune.engine.flag_tables import FlagTables

TYPOGRAPHIC_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"
"""Hyphen, non-breaking hyphen, figure dash, en dash, em dash, horizontal bar, minus sign:
what a word processor or a chat makes of `--`."""

# How an engine's parser reads a flag's name: the option it is, as the flag table names it,
# and its arity there ("*" for a name the table lacks, which is reported on its own).
NameReader = Callable[[str], tuple[str, str]]


def is_value(token: str) -> bool:
    """Whether argparse takes a token as a value: it starts with no dash, or is a number."""
    return not token.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", token) is not None


def with_ascii_dashes(extra_args: Sequence[str], engine: str) -> tuple[list[str], list[Violation]]:
    """The arguments as meant, a leading typographic dash made `--`, and a problem for each
    one so pasted: the parser would read it as a value, not a flag."""
    meant = list(extra_args)
    problems = []
    for index, token in enumerate(extra_args):
        # The leading run of dashes, when it holds a typographic one (a mix such as a
        # non-breaking hyphen and a hyphen included).
        dashes = re.match(
            f"^[-{TYPOGRAPHIC_DASHES}]*[{TYPOGRAPHIC_DASHES}][-{TYPOGRAPHIC_DASHES}]*", token
        )
        if dashes:
            typographic = sorted(set(dashes[0]) - {"-"})
            names = ", ".join(unicodedata.name(c, hex(ord(c))) for c in typographic)
            meant[index] = "--" + token[dashes.end() :]
            problems.append(
                Violation(
                    f"spec.engine.extraArgs[{index}]",
                    f"{token!r} starts with a typographic dash ({names}), which {engine} reads "
                    f"as a value; write {meant[index]!r}",
                )
            )
    return meant, problems


def value_problem(
    tables: FlagTables, option: str, value: str, version: str, *, choices_too: bool
) -> str | None:
    """Why the parser would refuse `value` for `option`, if it would. The types of values hold
    from release to release; the lists of choices grow, so they are checked only against the
    table of the image's own version (`choices_too`)."""
    kind, choices = tables.flag_values(version).get(option, ("-", ()))
    if not choices_too:
        choices = ()
    converted: object = value
    try:
        if kind == "int":
            converted = int(value)
        elif kind == "float":
            converted = float(value)
    except ValueError:
        return f"{option} takes {'an integer' if kind == 'int' else 'a number'}, not {value!r}"
    if choices and str(converted) not in choices:
        removal = tables.removed_value(option, str(converted), version)
        if removal is not None:
            left = ", ".join(choices)
            return f"{value!r} was removed from {option} {removal.when()}: use one of {left}"
        near = difflib.get_close_matches(value, choices, n=1)
        hint = f"; did you mean {near[0]}?" if near else f" (one of {', '.join(choices)})"
        return f"{value!r} is not a value {option} takes{hint}"
    return None


def _takes(arity: str) -> tuple[int, int | None]:
    """The fewest and most values (None: no limit) an argparse arity allows."""
    return {"0": (0, 0), "?": (0, 1), "*": (0, None), "+": (1, None)}.get(arity, (1, 1))


def check_values(
    extra_args: Sequence[str],
    read: NameReader,
    refused: Callable[[str, str], str | None],
    *,
    switches: Collection[str],
    engine: str,
) -> list[Violation]:
    """Each flag's values counted as the parser counts them: a switch given a value, a flag
    missing its value, a value no flag takes; and each single value against `refused` (why
    the parser would refuse it for an option, if it would). Unknown flags are reported
    elsewhere and take whatever follows them here. `switches`: the options, to name a
    switch's `--no-` form where the parser has one."""
    problems = []
    index = 0
    while index < len(extra_args):
        token = extra_args[index]
        where = f"spec.engine.extraArgs[{index}]"
        if is_value(token):
            owner = "; the model is set by spec.model.name" if index == 0 else ""
            problems.append(Violation(where, f"{token!r} is a value with no flag before it{owner}"))
            index += 1
            continue
        name, equals, _ = token.partition("=")
        option, counted = read(name)
        least, most = _takes(counted)
        room = None if most is None else max(0, most - bool(equals))
        rest = extra_args[index + 1 :]
        values = 0  # the values that follow the flag as separate tokens
        while (room is None or values < room) and values < len(rest) and is_value(rest[values]):
            values += 1
        following = rest[0] if rest else None
        given = values + bool(equals)
        if most == 0 and (equals or (following is not None and is_value(following))):
            stray = token.partition("=")[2] if equals else following
            negative = f"--no-{option.removeprefix('--')}"
            switch = f"; to turn it off write {negative}" if negative in switches else ""
            problems.append(
                Violation(
                    where,
                    f"{option} is a switch and takes no value, but is given {stray!r} ({engine} "
                    f"exits with 'unrecognized arguments'): write {option} alone{switch}",
                )
            )
            values = 1 if not equals else 0  # the stray value is reported here, not again
        elif given < least:
            after = f", but {following!r} follows it" if following is not None else ""
            problems.append(
                Violation(
                    where,
                    f"{option} takes a value{after} ({engine} exits with 'expected one "
                    f"argument'): write {option} VALUE",
                )
            )
        elif most == 1 and given == 1:
            value = token.partition("=")[2] if equals else rest[0]
            problem = refused(option, value)
            if problem is not None:
                problems.append(
                    Violation(
                        where,
                        f"{problem} ({engine} exits with 'invalid choice' or 'invalid value')",
                    )
                )
        index += 1 + values
    return problems


def flag_uses(
    extra_args: Sequence[str], read: Callable[[str], str], options: Collection[str]
) -> list[tuple[int, str, str]]:
    """(index, option, value) of each use of the given options, `--opt value` or `--opt=value`,
    each name read as the parser reads it (`read`); the value is empty where none follows."""
    found = []
    for index, token in enumerate(extra_args):
        name, equals, value = token.partition("=")
        option = read(name)
        if option not in options:
            continue
        if not equals:
            following = extra_args[index + 1] if index + 1 < len(extra_args) else ""
            value = following if is_value(following) else ""
        found.append((index, option, value))
    return found


def nearest_flag(option: str, known: Iterable[str]) -> str | None:
    """The real flag closest to a name the parser does not know, if one is close."""
    near = difflib.get_close_matches(option, sorted(known), n=1, cutoff=0.75)
    return near[0] if near else None
