"""Dumps every option string of the real `vllm serve` parser, with how many values it takes,
for slotune's flag table (one file per vLLM version; `slotune.engine.vllm.tables` reads them).

Run with the vLLM environment's python (scripts/setup-vllm-cpu.sh prints it):
    $(scripts/setup-vllm-cpu.sh) scripts/dump-vllm-flags.py \
        operator/slotune/engine/vllm/flags/<version>.txt
    $(scripts/setup-vllm-cpu.sh --version 0.31.0) scripts/dump-vllm-flags.py \
        operator/slotune/engine/vllm/flags/0.31.0.txt

The CUDA release of the GPU study (bench/gpu/build_bundle.py unpacks its site-packages for
CPython 3.12 into bench/gpu/.build/site; torch 2.11 and the device image's other packages
come from a python3.12 environment of your own) is dumped on a machine without a GPU with
`--platform cuda`:
    PYTHONPATH=bench/gpu/.build/site python3.12 scripts/dump-vllm-flags.py --platform cuda \
        operator/slotune/engine/vllm/flags/0.24.0.txt

The table's format is parser_dump.py's (shared with dump-sglang-flags.py). `--quantization`
lists no choices in the parser; vLLM checks it against its registry of quantization methods at
start-up, and that registry is dumped as its choices.
"""

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

import vllm
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
from vllm.utils.argparse_utils import FlexibleArgumentParser

from parser_dump import table_rows, write_table

# The platforms `--platform` stands in for. Building the parser builds a `DeviceConfig`, which
# asks vLLM's platform detection for a device type, and the CUDA build finds none on a machine
# without a GPU ("Failed to infer device type"); its real platform cannot stand in, since
# `vllm.platforms.cuda` loads the CUDA driver (libcuda.so.1) on import. `cpu` is there to check
# the stand-in: a CPU build dumped with and without it gives the same table.
PLATFORMS = ("cpu", "cuda")

# Where `vllm/entrypoints/cli/serve.py` imports `make_arg_parser` from, newest first: the CPU
# releases 0.31 and 0.32 have it in `entrypoints.launchers`, 0.24.0 in `entrypoints.openai`.
PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")


def serve_parser_module() -> ModuleType:
    for name in PARSER_MODULES:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as missing:
            if missing.name is None or not name.startswith(missing.name):
                raise  # the module is there, but something it imports is not
    sys.exit(f"vLLM {vllm.__version__} has no {' or '.join(PARSER_MODULES)}")


def stand_in_platform(name: str) -> list[str]:
    """Makes `vllm.platforms.current_platform` a stand-in that says it is the named platform
    (its device type, its `is_cuda()`, `is_cpu()`) and answers everything else as vLLM's
    `UnspecifiedPlatform`. Returns the names the parser asks it for (filled as it asks),
    so that the table says what the stand-in decided."""
    import vllm.platforms  # noqa: PLC0415
    from vllm.platforms.interface import PlatformEnum, UnspecifiedPlatform  # noqa: PLC0415

    asked: list[str] = []

    class StandIn(UnspecifiedPlatform):
        _enum = PlatformEnum[name.upper()]
        device_name = device_type = name

        def __getattribute__(self, attribute: str) -> object:
            if not attribute.startswith("__") and attribute not in asked:
                asked.append(attribute)
            return object.__getattribute__(self, attribute)

    # A plain module attribute wins over the module's lazy `__getattr__`.
    vllm.platforms.current_platform = StandIn()
    return asked


arguments = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
arguments.add_argument("table", type=Path, help="the file to write")
arguments.add_argument(
    "--platform", choices=PLATFORMS, help="build the parser for this platform, through a stand-in"
)
given = arguments.parse_args()
asked = stand_in_platform(given.platform) if given.platform else []

parser = serve_parser_module().make_arg_parser(FlexibleArgumentParser())
rows = table_rows(parser, choices_of={"quantization": QUANTIZATION_METHODS})
comments = [
    f"Options accepted by `vllm serve` in vLLM {vllm.__version__}, dumped from its parser",
    "by scripts/dump-vllm-flags.py: arity, value type, choices. Do not edit.",
]
if given.platform:
    comments += [
        f"Built without its platform, through a stand-in for vLLM's {given.platform} "
        f"platform (--platform {given.platform}),",
        f"which the parser asked: {', '.join(sorted(asked))}.",
    ]
# Written to a file: importing vLLM prints to stdout on its own.
write_table(given.table, comments, rows)
