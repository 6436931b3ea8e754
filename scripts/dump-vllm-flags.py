"""Dumps every option string of the real `vllm serve` parser, for slotune's flag table.

Run with the vLLM environment's python (scripts/setup-vllm-cpu.sh prints it):
    $(scripts/setup-vllm-cpu.sh) scripts/dump-vllm-flags.py \
        > operator/slotune/engine/vllm_flags/<version>.txt
"""

import vllm
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser())
options = sorted({option for action in parser._actions for option in action.option_strings})
print(f"# Options accepted by `vllm serve` in vLLM {vllm.__version__}, dumped from its parser")
print("# by scripts/dump-vllm-flags.py. Do not edit.")
for option in options:
    print(option)
