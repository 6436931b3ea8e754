"""Dumps every option string of the real `vllm serve` parser, with how many values it takes,
for slotune's flag table.

Run with the vLLM environment's python (scripts/setup-vllm-cpu.sh prints it):
    $(scripts/setup-vllm-cpu.sh) scripts/dump-vllm-flags.py \
        operator/slotune/engine/vllm/flags/<version>.txt

Each line is `OPTION ARITY TYPE CHOICES`: the arity as argparse counts values, 0 (a switch), 1
(one value), or argparse's own ?, * and +; the type its values are converted with, `int` or
`float` where the parser uses exactly those, else `-` (a string, or a conversion of vLLM's own);
the values it accepts, comma-separated, where the parser lists them and compares the text (or
its int or float) with them, else `-`. `--quantization`
lists no choices in the parser; vLLM checks it against its registry of quantization methods at
start-up, and that registry is dumped as its choices.
"""

import sys
from pathlib import Path

import vllm
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser())
rows = {}
for action in parser._actions:
    nargs = action.nargs
    counted = "1" if nargs is None else str(nargs)
    kind = {int: "int", float: "float"}.get(action.type, "-")
    listed = action.choices
    if action.type not in (None, str, int, float):
        listed = None  # a conversion of vLLM's own runs first: its choices are not the text
    if action.dest == "quantization":
        listed = QUANTIZATION_METHODS
    choices = ",".join(str(c) for c in listed) if listed else "-"
    if counted == "0":
        kind, choices = "-", "-"
    for option in action.option_strings:
        rows[option] = f"{counted} {kind} {choices}"
# Written to a file: importing vLLM prints to stdout on its own.
with Path(sys.argv[1]).open("w") as table:
    table.write(
        f"# Options accepted by `vllm serve` in vLLM {vllm.__version__}, dumped from its parser\n"
        "# by scripts/dump-vllm-flags.py: arity, value type, choices. Do not edit.\n"
    )
    for option in sorted(rows):
        table.write(f"{option} {rows[option]}\n")
