"""Scales the README's example study (examples/tune-cpu.yaml) to the speed of this machine.

The example is written for a reference CPU: one that prefills REFERENCE_PREFILL_TPS prompt
tokens/s of its prompts with vLLM's defaults (the machine of the README's figures prefilled
25,000-35,000). On a slower or faster CPU the same problem is the same in the engine's own
time: every latency bound of the SLO is multiplied by `reference / measured` and the request
rate divided by it. Without this, a fixed rate and a fixed 40 ms inter-token bound are an easy
problem on a fast machine and one with no feasible answer on a slow one (bench/results/
make-tune-runs.md, runs 5 and 6).

The script starts vLLM's defaults once, measures their prefill ceiling the way a study's
first trial does (its warm-up, then `slotune.measure.probe.measure_ceiling`), and writes the
scaled example to OUT with a header that says what was measured. An OUT that exists is kept,
so that a resumed study goes on with the SLO and rate it started with.

    python scripts/scale_example.py examples/tune-cpu.yaml tune-out/tiny-chat/example.yaml \
        --vllm-python PYTHON --model-dir operator/slotune/engine/models/tiny-llama
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

import yaml

from slotune.local.process import LocalRuntime
from slotune.local.runner import defaults_config, load_deployment
from slotune.measure.capacity import Ceiling
from slotune.measure.probe import CapacityMeasure, measure_ceiling
from slotune.models import LLMDeploymentSpec
from slotune.tuner.space import CPU

REFERENCE_PREFILL_TPS = 30_000.0
"""Prompt tokens/s of the example's prompts that the example's figures are written for."""
ENGINE_START = 300.0


async def _warm_then_ceiling(base_url: str, spec: LLMDeploymentSpec) -> Ceiling:
    """In a study's first trial's order: its warm-up requests, then the ceiling."""
    await CapacityMeasure(spec, "ceiling").warm_up(base_url)
    return await measure_ceiling(base_url, "ceiling", spec.tuning.workload)


def measured_prefill_tps(example: Path, vllm_python: Path, model_dir: Path, kv_gib: int) -> float:
    """The prefill ceiling of vLLM's CPU defaults on the example's workload, on this machine."""
    spec = load_deployment(example).spec
    kv_space = (("VLLM_CPU_KVCACHE_SPACE", str(kv_gib)),)
    config = defaults_config(spec, CPU, str(model_dir), "ceiling", kv_space)
    with tempfile.TemporaryDirectory(prefix="slotune-scale-") as work:
        runtime = LocalRuntime(vllm_python, Path(work), dummy_weights=True)
        engine = runtime.start(config, timeout=ENGINE_START)
        try:
            ceiling = asyncio.run(_warm_then_ceiling(engine.base_url, spec))
        finally:
            engine.stop()
    return ceiling.prefill_tps


def scaled(document: dict[str, Any], factor: float) -> dict[str, Any]:
    """The example with every SLO bound times `factor` and the request rate divided by it."""
    spec = document["spec"]
    for target in spec["slo"].values():
        if isinstance(target, dict) and "maxSeconds" in target:
            target["maxSeconds"] = round(target["maxSeconds"] * factor, 4)
    workload = spec["tuning"]["workload"]
    workload["requestRate"] = round(workload["requestRate"] / factor, 2)
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("example", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--vllm-python", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--kv-cache-gib", type=int, default=2)
    args = parser.parse_args()
    if args.out.exists():
        print(f"Keeping {args.out} (scaled when this study began; delete it to measure again)")
        return
    print("Measuring this machine: the prefill ceiling of vLLM's defaults on the example's prompts")
    tps = measured_prefill_tps(args.example, args.vllm_python, args.model_dir, args.kv_cache_gib)
    factor = REFERENCE_PREFILL_TPS / tps
    document = scaled(yaml.safe_load(args.example.read_text()), factor)
    spec = document["spec"]
    bounds = ", ".join(
        f"{name} p{target['percentile']} <= {target['maxSeconds'] * 1000:.0f} ms"
        for name, target in spec["slo"].items()
        if isinstance(target, dict) and "maxSeconds" in target
    )
    rate = spec["tuning"]["workload"]["requestRate"]
    header = (
        f"# {args.example}, scaled to this machine: it prefilled {tps:,.0f} prompt tokens/s\n"
        f"# with vLLM's defaults, {tps / REFERENCE_PREFILL_TPS:.2f}x the reference machine's\n"
        f"# {REFERENCE_PREFILL_TPS:,.0f} (scripts/scale_example.py): SLO {bounds}; {rate} req/s.\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + yaml.safe_dump(document, sort_keys=False))
    print(
        f"This machine prefills {tps:,.0f} prompt tokens/s, {tps / REFERENCE_PREFILL_TPS:.2f}x "
        f"the example's reference: the study asks {bounds} at {rate} req/s ({args.out})"
    )


if __name__ == "__main__":
    main()
