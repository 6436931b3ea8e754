"""vLLM's defaults and the study's winner (or chosen trials) side by side in one session: each
one's capacity, and the engine's prefill ceiling.

`--configs` names what to measure; results already in `--json` are kept, so a device session
of several calls (10 minutes each) measures one configuration per call on the same machine.

Each configuration gets a fresh engine start (the LocalRuntime the tuner uses) and the same
capacity search the trials run (`slotune.measure.probe.CapacityMeasure`), on the same arrival
schedules: one workload seed, unused by the study (its screening used `seed`, its
re-measurements `seed + 1`), so neither configuration is judged on the arrivals it was picked
on. The prefill and decode ceilings are measured on the defaults' engine.

"vLLM's defaults" means no tuned flag at all (only the spec's maxModelLen): the engine resolves
its own defaults, as a user who sets nothing gets them. The winner is the one the tuner
declares from the study's records; with none it is the record with the highest capacity, and
the output says so. A configuration may also be named with its settings, `NAME={"quantization":
"fp8", ...}` (the fields of `spec.engine.args`, in snake case).

`--ceilings` names the configurations whose engine's prefill and decode ceilings are measured
(fp8 weights move the prefill ceiling). `--quality` takes the first configuration (which must be
lossless) as the quality gate's reference (`slotune.measure.quality`) and holds every later one
to it: KL and top-token agreement on the same seeded sequences. `--seeded-weights` serves
weights written by tests/support/seeded_weights.py instead of `--load-format dummy`, whose flat
distributions no gate can judge; either way the weights are random, and the KL measures
numeric perturbation, not task quality.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from slotune.local.process import LocalRuntime
from slotune.local.runner import load_deployment
from slotune.measure import quality, scoring
from slotune.measure.capacity import Capacity, Ceiling, MeasureRequest, required_rate, versus
from slotune.measure.probe import CapacityMeasure
from slotune.models import EngineArgs
from slotune.runtime import EngineConfig
from slotune.tuner.loop import Finished, Planner
from slotune.tuner.records import RecordStore, TrialRecord
from slotune.tuner.space import PLATFORMS


def pick_winner(spec: Any, records: list[TrialRecord], platform: str) -> tuple[Any, str]:
    tuner = Planner(
        spec,
        platform=PLATFORMS[platform],
        model="-",
        served_name="-",
        records=records,
    )
    planned = tuner.plan()
    if isinstance(planned, Finished) and planned.winner is not None:
        return planned.winner, "the study's confirmed winner"
    measured = [r for r in records if r.measurement is not None and r.measurement.capacity]
    if not measured:
        return None, "no trial was measured"
    best = max(measured, key=lambda r: r.measurement.capacity_rate if r.measurement else 0.0)
    return best, "no confirmed winner yet: the record with the highest capacity"


def chosen(
    spec: Any, records: list[TrialRecord], platform: str, names: list[str]
) -> list[tuple[str, dict[str, Any], str]]:
    """The configurations to measure: "defaults" (no tuned flag at all), "winner" (the study's,
    or its best record), or a trial number of the records."""
    configs: list[tuple[str, dict[str, Any], str]] = []
    for name in names:
        if name == "defaults":
            configs.append(("vllm-defaults", {}, "no tuned flag: vLLM resolves its own defaults"))
        elif name == "winner":
            winner, why = pick_winner(spec, records, platform)
            if winner is not None:
                configs.append((f"winner (trial #{winner.number})", dict(winner.params), why))
        elif "=" in name:
            label, _, settings = name.partition("=")
            configs.append((label, json.loads(settings), "named with its settings"))
        else:
            record = next((r for r in records if str(r.number) == name), None)
            if record is None:
                raise SystemExit(f"no trial #{name} in the records")
            configs.append((f"trial #{record.number}", dict(record.params), "chosen by number"))
    return configs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument(
        "--json", type=Path, required=True, help="results; configurations already in it are kept"
    )
    parser.add_argument(
        "--configs",
        default="defaults;winner",
        help="semicolon-separated: defaults, winner, trial numbers of the records, or "
        'NAME={"field": value, ...}',
    )
    parser.add_argument(
        "--ceilings",
        default="vllm-defaults",
        help="comma-separated labels whose engine's ceilings are measured",
    )
    parser.add_argument("--quality", action="store_true", help="the quality gate, see above")
    parser.add_argument(
        "--seeded-weights", help="a model folder with seeded weights, served in place of dummy"
    )
    parser.add_argument("--platform", default="h200")
    parser.add_argument("--vllm-python", type=Path, default=Path("python3"))
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    deployment = load_deployment(args.spec)
    spec = deployment.spec
    served = spec.model.served_name or deployment.metadata.name
    rate = spec.tuning.workload.request_rate
    if spec.slo is None or rate is None:
        raise SystemExit("the spec needs an slo and a workload requestRate")
    target = required_rate(rate, spec.tuning.headroom)
    records = RecordStore(args.records).load()
    configs = chosen(spec, records, args.platform, args.configs.split(";"))
    model_dir = args.seeded_weights or args.model_dir
    runtime = LocalRuntime(args.vllm_python, args.work, dummy_weights=not args.seeded_weights)
    # Seeded weights come without a tokenizer: prompts are token ids.
    extra = ("--skip-tokenizer-init",) if args.seeded_weights else ()
    gate = Gate(args.work / "quality-reference.json", spec) if args.quality else None
    measure = CapacityMeasure(spec, served, log=lambda line: print("  " + line, flush=True))
    seed = spec.tuning.seed + 2
    result: dict[str, Any] = {"target_rate": target, "seed": seed, "configs": []}
    if args.json.exists():  # a later call of the same session goes on where the last ended
        result = json.loads(args.json.read_text())
    ceiling = Ceiling.model_validate(result["ceiling"]) if result.get("ceiling") else None
    ceilings = set(args.ceilings.split(","))
    done = {c["label"] for c in result["configs"]}
    for label, params, note in configs:
        if label in done:
            print(f"{label}: measured already", flush=True)
            continue
        engine_args = EngineArgs.model_validate({**spec.engine.args.explicit(), **params})
        config = EngineConfig(
            model=model_dir, served_name=served, args=engine_args, extra_args=extra
        )
        print(f"Starting {label}: {' '.join(runtime.command(config, 0)[3:])}", flush=True)
        engine = runtime.start(config, timeout=600)
        figures = None
        try:
            request = MeasureRequest(
                seed=seed,
                target_rate=target,
                measure_ceiling=ceiling is None or label in ceilings,
                ceiling=ceiling,
                precise=True,
            )
            m = measure(engine.base_url, request)
            if gate is not None:
                figures = gate.check(label, scoring.Scorer(engine.base_url, served))
        finally:
            engine.stop()
        ceiling = ceiling or m.ceiling
        result["configs"].append(
            {
                "label": label,
                "params": params,
                "note": note,
                "startup_seconds": engine.facts.startup_seconds,
                "kv_cache_tokens": engine.facts.kv_cache_tokens,
                "capacity": m.capacity.model_dump(mode="json") if m.capacity else None,
                "ceiling": m.ceiling.model_dump(mode="json") if m.ceiling else None,
                "quality": figures,
            }
        )
        result["ceiling"] = ceiling.model_dump(mode="json") if ceiling else None
        summarise(result, ceiling)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{label}: capacity {m.capacity.describe() if m.capacity else '-'}", flush=True)
    print(json.dumps({k: v for k, v in result.items() if k != "configs"}), flush=True)
    return 0


class Gate:
    """The quality gate across the configurations of one session: the first takes the
    reference (kept in a file, so that a later call goes on), every later one is held to it,
    lossless ones too (a control: their KL is the engine's own noise). Unlike a study's gate
    (`slotune.tuner.gate`), it gates every configuration, and a failure to score is printed
    and kept in the results, not raised, so that the capacity measured is not lost."""

    def __init__(self, path: Path, spec: Any) -> None:
        self.path = path
        self.bounds = spec.tuning.quality
        self.workload = spec.tuning.workload
        self.seed = spec.tuning.seed

    def check(self, label: str, engine: scoring.Scorer) -> dict[str, Any] | None:
        try:
            return self._check(label, engine)
        except scoring.SCORING_ERRORS as error:
            print(f"  {scoring.not_scored(error)}", flush=True)
            return {"error": scoring.not_scored(error)}

    def _check(self, label: str, engine: scoring.Scorer) -> dict[str, Any] | None:
        if not self.path.exists():
            reference = scoring.take_reference(engine, self.bounds, self.workload, self.seed)
            reference.save(self.path)
            print(f"  {label} is the quality reference", flush=True)
            return {"reference": True}
        reference = scoring.Reference.from_json(self.path.read_text())
        figures = reference.hold(engine)
        verdict = quality.judge(figures, self.bounds)
        print(
            f"  quality against the first configuration: {figures.describe()}: "
            f"{verdict or 'passes the gate'}",
            flush=True,
        )
        return {**figures.model_dump(), "verdict": verdict or "passes"}


ADDED = ("fraction_of_prefill_ceiling", "ratio_to_defaults", "versus_defaults")


def _capacity(stored: dict[str, Any]) -> Capacity:
    return Capacity.model_validate({k: v for k, v in stored.items() if k not in ADDED})


def summarise(result: dict[str, Any], ceiling: Ceiling | None) -> None:
    """Each capacity as a fraction of the prefill ceiling's rate, and against the defaults':
    the plain ratio and the paired verdict (both on the same arrival schedules)."""
    base = next((c["capacity"] for c in result["configs"] if c["label"] == "vllm-defaults"), None)
    for c in result["configs"]:
        cap = c["capacity"]
        if cap is None:
            continue
        if ceiling is not None and ceiling.prefill_rate:
            cap["fraction_of_prefill_ceiling"] = round(cap["capacity"] / ceiling.prefill_rate, 4)
        if base is not None and base["capacity"] > 0 and c["label"] != "vllm-defaults":
            cap["ratio_to_defaults"] = round(cap["capacity"] / base["capacity"], 4)
            paired = versus(_capacity(cap), _capacity(base))
            cap["versus_defaults"] = paired.describe()


if __name__ == "__main__":
    raise SystemExit(main())
