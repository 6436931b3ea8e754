"""Benchmark: what a shared cache folder saves a trial's engine start on a GPU.

Each start of vLLM compiles the model (torch.compile: Dynamo, Inductor, Triton kernels) and
captures CUDA graphs. vLLM keeps the compiled artefacts under `VLLM_CACHE_ROOT`, keyed by a
hash of the configuration that shapes the graph (`max_num_batched_tokens` is in that key;
`max_num_seqs` is not in vLLM 0.24's, the GPU bundle's, but is in 0.32's), and Inductor and
Triton keep theirs in folders of their own. A folder
shared by every trial pod (a PVC) keeps all three between starts.

Engines start one after another, each timed from process start to a healthy `/health`
(`LocalRuntime`), each with every cache the stack writes pointed into one folder
(`VLLM_CACHE_ROOT`, `TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`, `CUDA_CACHE_PATH`,
`XDG_CACHE_HOME`, `HOME`). The steps, by default:

    cold      vLLM's defaults, an empty folder
    warm      the same configuration again, the same folder
    seqs      only max_num_seqs changed (outside vLLM 0.24's compile-cache key)
    batched   max_num_batched_tokens changed (inside the key)
    cold      vLLM's defaults, a new empty folder (a second cold start: the machine's own
              first-start costs, such as reading the libraries from disk, fall on the first)
    warm      the same again

Each step's seconds and the engine log's own compile and graph-capture lines go to --json,
rewritten after every step (a run cut short keeps its figures).

    python3 bench/gpu/compile_cache.py --spec bench/gpu/h100-study.yaml --platform h100 \
        --model-dir bench/gpu/llama-8b --work /tmp/slotune-cache-work \
        --json /tmp/slotune-cache/compile-cache.json
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from slotune.local.process import LocalRuntime
from slotune.local.runner import load_deployment
from slotune.tuner.loop import engine_config
from slotune.tuner.space import PLATFORMS

STEPS = "cold:defaults,warm:defaults,seqs:seqs,batched:batched,cold:defaults,warm:defaults"
LOG_LINES = re.compile(
    r"(torch\.compile takes.*|Compiling a graph.*|Directly load the compiled graph.*"
    r"|Graph capturing finished.*|init engine .* took.*|Loading model weights took.*"
    r"|Dynamo bytecode transform time.*|Cache the graph.*)"
)


def cache_env(folder: Path) -> tuple[tuple[str, str], ...]:
    return (
        ("VLLM_CACHE_ROOT", str(folder / "vllm")),
        ("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor")),
        ("TRITON_CACHE_DIR", str(folder / "triton")),
        ("CUDA_CACHE_PATH", str(folder / "nv")),
        ("XDG_CACHE_HOME", str(folder / "xdg")),
        ("HOME", str(folder / "home")),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--platform", choices=sorted(PLATFORMS), required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--vllm-python", type=Path, default=Path("python3"))
    parser.add_argument("--steps", default=STEPS, help=f"name:config,... (default {STEPS})")
    parser.add_argument("--seqs", type=int, default=256, help="max_num_seqs of `seqs`")
    parser.add_argument("--batched", type=int, default=2048, help="batched tokens of `batched`")
    parser.add_argument("--work", type=Path, required=True, help="engine logs and cache folders")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    spec = load_deployment(args.spec).spec
    platform = PLATFORMS[args.platform]
    defaults = dict(platform.defaults)
    configs = {
        "defaults": defaults,
        "seqs": {**defaults, "max_num_seqs": args.seqs},
        "batched": {**defaults, "max_num_batched_tokens": args.batched},
    }
    runtime = LocalRuntime(args.vllm_python, args.work / "engines", dummy_weights=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    folder: Path | None = None
    for step in args.steps.split(","):
        name, config_name = step.split(":")
        if name == "cold" or folder is None:
            folder = Path(tempfile.mkdtemp(prefix="cache-", dir=args.work))
        params = configs[config_name]
        config = engine_config(spec, params, str(args.model_dir), "cache", cache_env(folder))
        began = time.monotonic()
        engine = runtime.start(config, timeout=900)
        seconds = time.monotonic() - began
        engine.stop()
        lines = LOG_LINES.findall(engine.log_path.read_text(errors="replace"))
        done.append(
            {
                "step": name,
                "config": config_name,
                "params": params,
                "folder": folder.name,
                "seconds_to_healthy": round(seconds, 1),
                "log": lines,
            }
        )
        print(f"{name:8} {config_name:9} {seconds:6.1f} s  ({folder.name})", flush=True)
        for line in lines:
            print(f"           {line}", flush=True)
        partial = args.json.with_name(args.json.name + ".tmp")
        partial.write_text(json.dumps({"platform": platform.name, "steps": done}, indent=1))
        partial.replace(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
