"""Fuzz: mutated LLMDeployments against the real API server and the operator.

Each spec starts from a sample (`samples/*.yaml`, or the tests' small valid one) and gets one
to three mutations: a leaf of another type, a huge or odd string (up to 400 KB; emoji,
control characters, typographic dashes), a number out of range, a required field dropped,
an unknown field, vLLM flags drawn from the parser's own table with the wrong number of
values, abbreviated or repeated, or with a value of the wrong type or choice, a plain API key,
names with dots or 64-253 characters, a megabyte of free-form affinity, a misspelt or
mistyped field in a security context, toleration or affinity, or an env name given twice or
set by slotune. Each is applied with server-side apply (what Argo CD does)
in a batch; then, for each batch:

- a spec the API server refused never reaches the operator: counted, with the field it named;
- an accepted spec must get a status for its generation within `--settle` seconds, and be
  either Ready-able (its Deployment exists and serves it) or say why not in a condition that
  names the field (`spec.…`), the child or the conflicting object;
- a spec error never ends in a retried `ApplyFailed` (the API server refusing an object slotune
  rendered from an accepted spec);
- an accepted spec that serves carries no `extraArgs` the parser's dumped tables refuse;
- every object of the batch is deleted, and must be gone within 60 s;
- the operator must still run (no restart) and its log hold no traceback.

    PYTHONPATH=tests .venv/bin/python bench/fuzz_specs.py --specs 300 \
        --json bench/results/fuzz-specs.json
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slotune.engine.vllm import rules as vllm
from slotune.engine.vllm import tables
from support.cluster import Cluster, OperatorProcess, llmd
from support.controlplane import ControlPlane, bin_dir_from_env

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "fuzz"

ODD_TEXT = [
    "\U0001f680 emoji outside the BMP \U0001d518\U0001d52b",
    "tab\tnewline\nbell\x07",
    "\u2014swap-space",  # typographic dashes
    "\u2013max-paddings",
    "--api-key",
    "-",
    "",
    " leading space",
    "x" * 300,
    "ünïcödé",
    "\u202eright-to-left",
]


def _samples() -> list[dict[str, Any]]:
    specs = [llmd("base", NAMESPACE)["spec"]]
    for path in sorted((ROOT / "samples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "LLMDeployment":
                specs.append(doc["spec"])
    return specs


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*path, k))] or [path]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*path, i))] or [path]
    return [path]


def _set(spec: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = spec
    for part in path[:-1]:
        node = node[part]
    if path:
        node[path[-1]] = value


def _flag_args(rng: random.Random) -> list[str]:
    """Real flags from the parser's table, with a wrong or right number of values, some
    abbreviated, repeated or with a unicode dash."""
    arity = vllm.flag_arity()
    flags = sorted(arity)
    out: list[str] = []
    for _ in range(rng.randint(1, 4)):
        flag = rng.choice(flags)
        kind = rng.random()
        if kind < 0.15:
            flag = flag[: max(4, len(flag) // 2)]  # abbreviated
        elif kind < 0.25:
            flag = "\u2014" + flag[2:]  # an em dash, as word processors write it
        values = {"0": 0, "1": 1, "?": rng.randint(0, 1), "+": rng.randint(1, 3)}.get(
            arity.get(flag, "1"), 1
        )
        values += rng.choice([0, 0, 0, -1, 1])
        out.append(flag)
        out += [
            rng.choice(["1", "true", "auto", "--seed", "-1", "64"]) for _ in range(max(values, 0))
        ]
    return out


@dataclass
class Fuzzed:
    """One fuzzed object: its spec and name, as the mutators leave them."""

    spec: dict[str, Any]
    name: str


def _path(leaf: tuple[Any, ...]) -> str:
    return ".".join(map(str, leaf))


def _wrong_type(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    _set(f.spec, leaf, rng.choice([None, 7, -1, 3.5, True, "x", [], {}, ["a"], {"a": 1}]))
    return f"type {_path(leaf)}"


def _huge(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    size = rng.choice([1_000, 20_000, 100_000, 300_000, 400_000])
    text = "y" * size
    where = rng.choice(["extraArgs", "env", "servedName", "leaf"])
    if where == "extraArgs":
        f.spec.setdefault("engine", {})["extraArgs"] = ["--chat-template", text]
    elif where == "env":
        f.spec.setdefault("engine", {})["env"] = [{"name": "BIG", "value": text}]
    elif where == "servedName":
        f.spec.setdefault("model", {})["servedName"] = text
    else:
        _set(f.spec, leaf, text)
        where = _path(leaf)
    return f"huge {size} at {where}"


def _odd_text(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    _set(f.spec, leaf, rng.choice(ODD_TEXT))
    return f"odd text {_path(leaf)}"


def _odd_number(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    _set(f.spec, leaf, rng.choice([0, -1, 2**31, 2**63, 1e308, -0.0, 1e-9]))
    return f"number {_path(leaf)}"


def _drop(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    section = rng.choice(["model", "engine", "slo", "resources", "tuning"])
    if rng.random() < 0.5:
        f.spec.pop(section, None)
    else:
        f.spec.get(section, {}).clear()
    return f"drop {section}"


def _flags(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    f.spec.setdefault("engine", {})["extraArgs"] = _flag_args(rng)
    return f"flags {f.spec['engine']['extraArgs'][:6]}"


def _unknown(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    f.spec[rng.choice(["chunkedPrefillSize", "swapSpace", "unknownField"])] = 1
    return "unknown field"


def _name(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    f.name = rng.choice(["llama-3.1-8b", "a" * rng.randint(64, 253), "x." * 40 + "y", "api"])
    return f"name {f.name[:20]} ({len(f.name)})"


def _affinity(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    terms = [
        {"matchExpressions": [{"key": f"k{i}", "operator": "In", "values": ["v" * 900]}]}
        for i in range(rng.choice([10, 400, 1100]))
    ]
    required = {"nodeSelectorTerms": terms}
    f.spec.setdefault("scheduling", {})["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
    }
    return f"affinity {len(terms)} terms"


def _api_key(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    secret = rng.choice(
        [
            {"extraArgs": ["--api-key", "s3cret"]},
            {"env": [{"name": "VLLM_API_KEY", "value": "s3cret"}]},
            {"apiKeySecretRef": {"name": "keys"}},
        ]
    )
    f.spec.setdefault("engine", {}).update(secret)
    return f"api key {sorted(secret)}"


def _tuning(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    bounds = {"min": rng.choice([1, 512, 8192]), "max": rng.choice([256, 4096, 2**21])}
    f.spec["tuning"] = {
        "enabled": rng.random() < 0.7,
        "maxTrials": rng.choice([0, 1, 20, 10**6]),
        "searchSpace": {"maxNumBatchedTokens": bounds},
    }
    return "tuning"


def _free_form(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    """A misspelt, snake_case or mistyped field where slotune passes Kubernetes' own types."""
    where, value = rng.choice(
        [
            ("securityContext", {"allowPrivilegeEscalaton": False}),
            ("securityContext", {"run_as_non_root": True}),
            ("securityContext", {"capabilities": {"drop": ["ALL"], "ad": ["NET_ADMIN"]}}),
            ("securityContext", {"runAsUser": "root"}),
            ("securityContext", {"seccompProfile": {"typ": "RuntimeDefault"}}),
            ("podSecurityContext", {"fsGroup": "1000"}),
            ("podSecurityContext", {"runAsNonRoot": True, "sysctl": []}),
            ("tolerations", [{"key": "nvidia.com/gpu", "opertor": "Exists"}]),
            ("tolerations", [{"key": "nvidia.com/gpu", "tolerationSeconds": "5"}]),
            ("affinity", {"nodeAffinty": {}}),
            ("affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu"}]}]}}}),
        ]
    )  # fmt: skip
    if where == "securityContext":
        f.spec.setdefault("engine", {})["securityContext"] = value
    elif where == "podSecurityContext":
        f.spec["podSecurityContext"] = value
    else:
        f.spec.setdefault("scheduling", {})[where] = value
    return f"free-form {where} {json.dumps(value)[:60]}"


def _env(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    """An env name given twice, or one slotune sets itself."""
    engine = f.spec.setdefault("engine", {})
    choice = rng.choice(["twice", "HF_HOME", "HF_TOKEN", "VLLM_SERVER_DEV_MODE"])
    if choice == "twice":
        engine["env"] = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    else:
        engine["env"] = [{"name": choice, "value": "x"}]
        if choice == "HF_TOKEN":
            source = {"huggingFace": {"tokenSecretRef": {"name": "hf", "key": "token"}}}
            f.spec.setdefault("model", {})["source"] = source
    return f"env {choice}"


def _flag_values(f: Fuzzed, rng: random.Random, leaf: tuple[Any, ...]) -> str:
    """A flag whose parser converts or lists its values, given a value it would refuse (or,
    now and then, one it takes)."""
    table = tables.flag_values()
    option = rng.choice(sorted(table))
    _, choices = table[option]
    value = rng.choice(
        ["abc", "", "1.5", "-", "ten"] + ([rng.choice(choices)] if choices else ["7"])
    )
    form = [f"{option}={value}"] if rng.random() < 0.5 else [option, value]
    f.spec.setdefault("engine", {})["extraArgs"] = form
    return f"flag value {form}"


MUTATORS = [
    _wrong_type, _huge, _odd_text, _odd_number, _drop, _flags, _unknown, _name, _affinity,
    _api_key, _tuning, _free_form, _env, _flag_values,
]  # fmt: skip


def mutate(spec: dict[str, Any], rng: random.Random) -> tuple[Fuzzed, list[str]]:
    """A mutated copy of the spec, with its object name, and what was done to it."""
    fuzzed = Fuzzed(copy.deepcopy(spec), f"f{rng.randrange(10**9)}")
    done = [
        rng.choice(MUTATORS)(fuzzed, rng, rng.choice(_leaves(fuzzed.spec)))
        for _ in range(rng.randint(1, 3))
    ]
    return fuzzed, done


def _names_what(message: str) -> bool:
    """A condition that says what to fix: a spec field, a child, or the object in the way."""
    return any(
        mark in message
        for mark in ("spec.", "spec:", "could not apply", "already exists", "rejected a rendered")
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible fuzz, not a secret
    samples = _samples()
    results: dict[str, Any] = {"specs": args.specs, "seed": args.seed}
    refused: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    problems: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="slotune-fuzz-") as tmp:
        work = Path(tmp)
        with ControlPlane(bin_dir_from_env(), work / "control-plane") as plane:
            cluster = Cluster(plane, plane.bin_dir)
            cluster.install_crd()
            kubeconfig = cluster.install_operator_rbac(work / "operator.kubeconfig")
            operator = OperatorProcess(kubeconfig, work / "operator.log")
            operator.start()
            cluster.kubectl("create", "namespace", NAMESPACE)
            made = 0
            while made < args.specs:
                batch = []
                for _ in range(min(args.batch, args.specs - made)):
                    fuzzed, done = mutate(rng.choice(samples), rng)
                    name = fuzzed.name
                    obj = {
                        "apiVersion": "slotune.dev/v1alpha1",
                        "kind": "LLMDeployment",
                        "metadata": {"name": name, "namespace": NAMESPACE},
                        "spec": fuzzed.spec,
                    }
                    applied = cluster.kubectl(
                        "apply", "--server-side", "-f", "-",
                        input=json.dumps(obj), check=False,
                    )  # fmt: skip
                    made += 1
                    if applied.returncode != 0:
                        refused[_refusal_kind(applied.stderr)] += 1
                        continue
                    batch.append((name, done))
                time.sleep(args.settle)
                for name, done in batch:
                    verdict, detail = _judge(cluster, name)
                    outcomes[verdict] += 1
                    if verdict in {
                        "no status",
                        "unexplained",
                        "apply failed",
                        "served args the parser refuses",
                    }:
                        problems.append({"name": name, "mutations": done, "why": detail})
                undeletable = _delete_all(cluster)
                outcomes["undeletable"] += len(undeletable)
                problems += [{"name": n, "why": "not gone 60 s after delete"} for n in undeletable]
                if operator.dead():
                    outcomes["operator restarts"] += 1
                    problems.append({"why": "the operator died", "log": operator.log()[-2000:]})
                    operator.start()
                print(
                    f"{made}/{args.specs}: refused {sum(refused.values())}, {dict(outcomes)}",
                    flush=True,
                )
            log = operator.log()
            operator.stop()
    results.update(
        refused_by_api_server=dict(refused),
        accepted=dict(outcomes),
        tracebacks=log.count("Traceback (most recent call last)"),
        problems=problems,
    )
    return results


def _refusal_kind(stderr: str) -> str:
    if "failed to create typed patch object" in stderr:
        return "wrong type (server-side apply)"
    for mark in ("Too long", "Too many", "Unsupported value", "Invalid value", "Required value",
                 "unknown field", "must not", "must be", "should be", "request entity too large",
                 "etcd", "ValidatingAdmissionPolicy"):  # fmt: skip
        if mark in stderr:
            return mark
    return stderr.strip().splitlines()[-1][:80] if stderr.strip() else "?"


def _judge(cluster: Cluster, name: str) -> tuple[str, str]:
    obj = cluster.get("llmd", name, NAMESPACE)
    if obj is None:
        return "gone", ""
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"].get("generation"):
        return "no status", json.dumps(status)[:300]
    ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
    degraded = next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), None)
    phase = status.get("phase")
    if (degraded or {}).get("reason") == "ApplyFailed" and "rejected" not in (degraded or {}).get(
        "message", ""
    ):
        return "apply failed", (degraded or {}).get("message", "")[:300]
    if phase in {"Pending", "Deploying", "Ready", "Tuning"}:
        if cluster.get("deployment", name, NAMESPACE) is None:
            return "unexplained", f"phase {phase} without a Deployment"
        engine = obj["spec"].get("engine") or {}
        if engine.get("kind", "vllm") == "vllm":
            image = engine.get("image") or "vllm/vllm-openai:v0.32.0"
            refused = vllm.check_extra_args(
                list(engine.get("extraArgs") or []), tables.version_of_image(image)
            )
            if refused:
                return "served args the parser refuses", "; ".join(map(str, refused))[:300]
        return "ready-able", ""
    message = " ".join(c.get("message", "") for c in (ready, degraded) if c)
    if _names_what(message):
        return f"condition ({(ready or {}).get('reason') or phase})", ""
    return "unexplained", f"phase {phase}: {message[:300]}"


def _delete_all(cluster: Cluster) -> list[str]:
    listed = cluster.kubectl("get", "llmd", "-n", NAMESPACE, "-o", "name", check=False)
    names = listed.stdout.split()
    if names:
        cluster.kubectl("delete", "llmd", "--all", "-n", NAMESPACE, "--wait=false", check=False)
    deadline = time.monotonic() + 60
    left = names
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = cluster.kubectl(
            "get", "llmd", "-n", NAMESPACE, "-o", "name", check=False
        ).stdout.split()
    return left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", type=int, default=300)
    parser.add_argument("--batch", type=int, default=30)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds before judging")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = run(args)
    text = json.dumps(results, indent=2, ensure_ascii=False)
    if args.json:
        Path(args.json).write_text(text + "\n")
    summary = {k: v for k, v in results.items() if k != "problems"}
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    for problem in results["problems"][:20]:
        print("PROBLEM", json.dumps(problem, ensure_ascii=False)[:600])
    bad = results["problems"] or results["tracebacks"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
