"""Writes an engine's argparse parser as one of slotune's flag tables (`flags/<version>.txt` in
the engine's adapter package, read by `slotune.engine.flag_tables`). Shared by the engines'
dump scripts (dump-vllm-flags.py, dump-sglang-flags.py), which build the real parser.

Each line is `OPTION ARITY TYPE CHOICES`: the arity as argparse counts values, 0 (a switch), 1
(one value), or argparse's own ?, * and +; the type its values are converted with, `int` or
`float` where the parser uses exactly those, else `-` (a string, or a conversion of the
engine's own); the values it accepts, comma-separated, where the parser lists them and compares
the text (or its int or float) with them, else `-`.
"""

import argparse
from collections.abc import Iterable, Mapping
from pathlib import Path


def table_rows(
    parser: argparse.ArgumentParser, choices_of: Mapping[str, Iterable[object]] | None = None
) -> dict[str, str]:
    """Each option string of the parser with the rest of its line. `choices_of` gives, by
    destination, the values an option accepts where the engine checks them after parsing
    rather than the parser (vLLM's registry of quantization methods)."""
    rows = {}
    for action in parser._actions:
        nargs = action.nargs
        counted = "1" if nargs is None else str(nargs)
        kind = {int: "int", float: "float"}.get(action.type, "-")
        listed: Iterable[object] | None = action.choices
        if action.type not in (None, str, int, float):
            listed = None  # a conversion of the engine's own runs first: not the text
        if choices_of and action.dest in choices_of:
            listed = choices_of[action.dest]
        if isinstance(listed, set | frozenset):
            listed = sorted(listed, key=str)  # a set has no order of its own
        choices = ",".join(str(c) for c in listed) if listed else "-"
        if counted == "0":
            kind, choices = "-", "-"
        for option in action.option_strings:
            rows[option] = f"{counted} {kind} {choices}"
    return rows


def write_table(path: Path, comments: Iterable[str], rows: Mapping[str, str]) -> None:
    """The table: its comment lines (each written after `# `), then a line an option, sorted."""
    with path.open("w") as table:
        for comment in comments:
            table.write(f"# {comment}\n")
        for option in sorted(rows):
            table.write(f"{option} {rows[option]}\n")
